"""Judging tactics from repeated timings: pure functions over recorded samples (verdict.py).
The timings themselves come from FlashInfer's own profiler in the tuning child."""
