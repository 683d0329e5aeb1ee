"""Watching a run: metrics records and sinks, run status, the status endpoint, dashboard, plots."""
