"""Tune FlashInfer operations directly (warm --engine flashinfer): plans, HF-config derivation,
and the child process that imports FlashInfer. Only driver.py and ops.py import torch/FlashInfer."""
