"""Observability: metric trackers (``tracking``), the run report (``report``) and greedy evaluation (``evaluate``).

Nothing here trains: the drivers in ``rlflow.trainer`` feed the trackers, and ``report`` /
``evaluate`` read what a run wrote (``python -m rlflow.observability.report``).
"""
