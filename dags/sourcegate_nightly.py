"""The sourcegate_nightly Airflow DAG, built from the installed package (sourcegate/dags/nightly.py)."""

from sourcegate.dags import nightly_dag

dag = nightly_dag()
