"""The Airflow DAGs, built by functions a DAG file calls: `dag = nightly_dag()`, `dag = recalibrate_dag()`."""

from sourcegate.dags.nightly import nightly_dag
from sourcegate.dags.recalibrate import recalibrate_dag

__all__ = ["nightly_dag", "recalibrate_dag"]
