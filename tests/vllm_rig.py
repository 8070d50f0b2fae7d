"""The vLLM warm/serve rig of tests/engines/vllm: a store, a `vllm` wrapper around
tests/fake_vllm.py (a STAND-IN for `vllm`, not vLLM) and a record dir of its starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from fi_cache.store.namespace import NAMESPACES_DIR
from tests.conftest import MOE_618_FUSED, ROOT

FAKE = ROOT / "tests" / "fake_vllm.py"
MODEL = "Qwen/Qwen3-30B-A3B"


def make_rig(tmp_path: Path) -> Rig:
    """A store, a `vllm` wrapper around the stand-in, and a record dir of its starts."""
    record = tmp_path / "record"
    record.mkdir()
    wrapper = tmp_path / "bin" / "vllm"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    env = {
        **os.environ,
        "FI_CACHE_VLLM": str(wrapper),
        "FAKE_VLLM_RECORD": str(record),
        "FAKE_VLLM_CACHE_SOURCE": str(MOE_618_FUSED),
        "PYTHONPATH": str(ROOT),
    }
    return Rig(tmp_path / "store", record, env)


class Rig:
    def __init__(self, store: Path, record: Path, env: dict[str, str]) -> None:
        self.store, self.record, self.env = store, record, env

    def cmd(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "fi_cache", "--store", str(self.store), *args]

    def run(self, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.cmd(*args),
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def popen(self, *args: str, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.cmd(*args),
            env={**self.env, **env},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            # A shell running the tests in the background (`cmd &`) leaves SIGINT ignored, and
            # Python keeps an ignored SIGINT: give the child the default a terminal user has.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler),
        )

    def starts(self) -> list[dict]:  # type: ignore[type-arg]
        path = self.record / "starts.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]

    def namespaces(self) -> list[Path]:
        return sorted(p.parent for p in (self.store / NAMESPACES_DIR).rglob("manifest.json"))


def vllm_dist(rig: Rig, version: str) -> dict[str, str]:
    """fi-cache sees vLLM `version` installed (a dist-info, nothing to import)."""
    site = rig.record / f"site-vllm-{version}"
    meta = site / f"vllm-{version}.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return {"PYTHONPATH": f"{rig.env['PYTHONPATH']}{os.pathsep}{site}"}
