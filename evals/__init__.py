"""sourcegate evals: calibration sweep, precision evals, the gate and the report.

They know nothing of search backends beyond the search interface in pipelines.search.
"""
