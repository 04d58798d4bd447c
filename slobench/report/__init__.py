"""Reports: the self-contained HTML attainment report and the terminal summary."""

from slobench.report.html import build_report

__all__ = ["build_report"]
