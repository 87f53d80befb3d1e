"""The sourcegate reports Airflow plugin, loaded from the installed package (sourcegate/plugins/reports.py)."""

from sourcegate.plugins.reports import SourcegateReportsPlugin

__all__ = ["SourcegateReportsPlugin"]
