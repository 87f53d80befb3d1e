"""The Airflow plugin that serves each run's report and gate verdict in the Airflow UI (reports.py)."""
