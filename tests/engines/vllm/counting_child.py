"""A STAND-IN for the vLLM Python that predict asks where a start's cache lives
(fi_cache/engines/vllm/predict.py): a shell script that prints one fixed answer and counts how
often it was asked, so a test can tell a saved answer reused from a question asked again."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CountingChild:
    python: Path  # what predict is given as vLLM's Python
    asks: Path  # one line a question

    def asked(self) -> int:
        """How many times predict asked the child (not its saved answer)."""
        return len(self.asks.read_text().splitlines())


def counting_child(tmp_path: Path, vllm_version: str) -> CountingChild:
    """tmp_path/python answers as vLLM `vllm_version` would, with a hash dir of tmp_path and no
    files; each question adds a line to tmp_path/asks."""
    asks, child = tmp_path / "asks", tmp_path / "python"
    answer = {
        "vllm_version": vllm_version,
        "hash": "a" * 64,
        "dir": str(tmp_path),
        "files": [],
        "root_from": "VLLM_CACHE_ROOT",
    }
    child.write_text(f"#!/bin/sh\necho x >> {asks}\necho '{json.dumps(answer)}'\n")
    child.chmod(0o755)
    return CountingChild(child, asks)
