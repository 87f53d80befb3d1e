"""Evaluation of an index version: decline calibration, precision, gate, report.

Plain Python data in, plain Python data out: nothing here imports Airflow or a
search backend.
"""
