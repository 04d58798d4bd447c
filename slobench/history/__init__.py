"""Headline metrics over commits: a JSONL history, change-point detection, and an offline HTML page."""

from slobench.history.changepoint import ChangePoint, find_change_points
from slobench.history.record import append_entry, entry_from_results, read_history

__all__ = ["ChangePoint", "append_entry", "entry_from_results", "find_change_points", "read_history"]
