"""Keeping a store and its files in shape: `prune.py` (which namespaces to delete, then deleting
them), `merge.py` (the union of v1 files with equal metadata)."""
