"""Finding and reading FlashInfer autotune caches anywhere on disk, read-only: `discover.py`
(every vLLM and FlashInfer layout), `inventory.py` (each found cache parsed into a `Cache`; bad
files become problems and the scan goes on)."""
