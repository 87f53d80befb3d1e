"""The sourcegate_recalibrate Airflow DAG, built from the installed package (sourcegate/dags/recalibrate.py)."""

from sourcegate.dags import recalibrate_dag

dag = recalibrate_dag()
