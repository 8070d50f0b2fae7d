"""The doctor is a library call: `diagnose(Request) -> Diagnosis`, which `fi-cache doctor` and
serve's pre-flight both reach findings through (read from their source, as tests/test_layout.py
reads the import graph), and which a script can call as they do."""

from __future__ import annotations

import ast
import dataclasses
import shutil
from pathlib import Path

import pytest

from fi_cache.doctor.diagnose import Diagnosis, Request, diagnose
from tests.conftest import GEMM_618, ROOT

# What a caller may take from fi_cache.doctor besides diagnose: the ids (to list and check
# them), the fix plan's apply (--fix writes; diagnosing never does), types.
_NOT_FINDINGS = {"diagnose", "check_ids", "fix", "findings", "inputs"}


def _doctor_names(path: Path) -> set[str]:
    """The fi_cache.doctor modules and names a module imports or calls (doctor.X(...))."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fi_cache.doctor"):
            rest = (node.module or "").removeprefix("fi_cache.doctor").lstrip(".")
            names |= {rest.split(".")[0]} if rest else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "fi_cache":
            names |= {"." if a.name == "doctor" else "" for a in node.names} - {""}
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            called = node.func.value
            if isinstance(called, ast.Name) and called.id == "doctor":
                names.add(f"doctor.{node.func.attr}")
    return names


def test_the_cli_reaches_findings_only_through_diagnose() -> None:
    names = _doctor_names(ROOT / "fi_cache" / "cli" / "doctor.py")
    assert "diagnose" in names
    assert names - _NOT_FINDINGS <= {".", "doctor.checks"}, names  # checks(): to list the ids


def test_serves_pre_flight_reaches_findings_only_through_diagnose() -> None:
    names = _doctor_names(ROOT / "fi_cache" / "doctor" / "preflight.py")
    assert "diagnose" in names
    assert not {"doctor.run", "doctor.run_checks", "gather", "sources"} & names, names
    text = (ROOT / "fi_cache" / "doctor" / "preflight.py").read_text()
    assert "scan(" not in text  # the pre-flight's caches are read by diagnose's sources
    serve = (ROOT / "fi_cache" / "lifecycle" / "checks.py").read_text()
    assert "preflight.check_namespace" in serve  # serve -> pre-flight -> diagnose


def test_a_script_diagnoses_as_the_cli_does(tmp_path: Path) -> None:
    cache = tmp_path / "autotune_configs.json"
    shutil.copy(GEMM_618, cache)
    asked = Request(tmp_path / "store", (cache,), flashinfer_version="0.6.18", gpu="H100")
    d = diagnose(asked)
    assert isinstance(d, Diagnosis) and d.errors == 1 and not d.refused
    [f] = d.findings
    assert (f.check, f.path) == ("foreign-environment", str(cache))
    assert d.target.fingerprint.gpu == "NVIDIA H100"
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.findings = ()  # type: ignore[misc]
    assert diagnose(dataclasses.replace(asked, gpu="H200")).findings == ()
