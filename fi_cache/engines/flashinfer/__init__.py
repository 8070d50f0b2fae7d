"""FlashInfer's own autotuner as an engine (warm --engine flashinfer): `plan.py` and
`hf_config.py` (tuning plans, pure), `warm.py` (one tuning run per finalize mode), `launch.py`
(the tuning child process), `engine.py` (the engines contract), and the child itself:
`__main__.py`, `driver.py`, `ops.py` (the only modules that import torch and FlashInfer).

This package's import must stay light: the tuning child imports it, in the serving venv's Python.
"""
