"""Every id a finding can carry is declared once (doctor/check_ids.py), listed by
`--list-checks`, selected by `--check ID`; a finding with nothing to do has `"fix": null`."""

from __future__ import annotations

import ast
import shutil
from collections.abc import Iterator
from pathlib import Path

from fi_cache import doctor
from fi_cache.doctor.check_ids import declared
from tests.conftest import ROOT
from tests.doctor.doctor_argv import JSON_DOCTOR, NODE_0_OF_2_TP_4, sglang_target, two_tp_ranks

PACKAGE = ROOT / "fi_cache"


def _constants(node: ast.AST) -> set[str]:
    """The strings an expression can be: a literal, or either branch of `a if c else b`."""
    if isinstance(node, ast.IfExp):
        return _constants(node.body) | _constants(node.orelse)
    return {node.value} if isinstance(node, ast.Constant) and isinstance(node.value, str) else set()


def _values(name: str, fn: ast.FunctionDef | None, tree: ast.Module) -> set[str]:
    """The strings a name in a Finding(...) call can hold: a module constant, a local
    assignment, or a parameter as the module's calls of its function pass it."""
    scopes = [fn, tree] if fn is not None else [tree]
    for scope in scopes:
        body = scope.body if isinstance(scope, ast.Module) else list(ast.walk(scope))
        for node in body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == name for t in node.targets
            ):
                return _constants(node.value)
    if fn is not None and name in (params := [a.arg for a in fn.args.args]):
        at = params.index(name)
        return {
            v
            for call in ast.walk(tree)
            if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == fn.name
            and len(call.args) > at
            for v in _constants(call.args[at])
        }
    return set()


def _findings_in_source() -> Iterator[tuple[str, str, set[str], set[str]]]:
    """(where, source text, ids, severities) of every Finding(...) call in fi_cache."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "Finding"):
                continue
            fn = next(
                (f for f in functions if f.lineno <= call.lineno <= (f.end_lineno or 0)), None
            )
            first, second = call.args[0], call.args[1]
            ids = _values(first.id, fn, tree) if isinstance(first, ast.Name) else _constants(first)
            severities = _constants(second)
            yield f"{path.relative_to(ROOT)}:{call.lineno}", ast.unparse(first), ids, severities


def test_every_finding_in_the_package_carries_a_declared_id_and_severity() -> None:
    ids = {c.id: c for c in declared(doctor.checks())}
    wrong, seen = [], 0
    for where, text, found, severities in _findings_in_source():
        seen += 1
        if not found:
            wrong.append(f"{where}: the id {text} cannot be read from the source")
        for i in found:
            if i not in ids:
                wrong.append(f"{where}: {i!r} is not declared (doctor/check_ids.py)")
            elif not severities <= set(ids[i].severities):
                wrong.append(
                    f"{where}: {i!r} as {sorted(severities)}, declared {ids[i].severities}"
                )
    assert seen > 50 and not wrong, "\n".join(wrong)


def test_each_id_is_declared_once_with_a_summary() -> None:
    from fi_cache.doctor.check_ids import SEVERITIES

    assert {c.id for c in doctor.checks()} == set(SEVERITIES)  # every check's severities, no more
    ids = [c.id for c in declared(doctor.checks())]
    assert len(ids) == len(set(ids))
    assert all(c.summary and c.severities for c in declared(doctor.checks()))


def test_the_ids_checks_emit_beside_their_own_are_listed(run) -> None:  # type: ignore[no-untyped-def]
    listed = {
        c["id"]: c for c in run("--format", "json", "doctor", "--list-checks").json()["checks"]
    }
    assert {"ranks-not-given", "vllm-ranks-partial-hit", "vllm-preload"} <= set(listed)
    assert listed["ranks-not-given"]["severities"] == ["info"]
    human = run("doctor", "--list-checks").out
    assert any(line.startswith("vllm-ranks-partial-hit ") for line in human.splitlines())


def test_check_selects_an_id_a_check_emits_beside_its_own(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    two_tp_ranks(tmp_path)
    argv = [*JSON_DOCTOR, *sglang_target("0.5.23", "0.6.18"), tmp_path]
    r = run(*argv, "--check", "ranks-not-given", *NODE_0_OF_2_TP_4)
    assert r.code == 0, r.err
    assert [f["check"] for f in r.json()["findings"]] == ["ranks-not-given"]


def test_a_finding_with_nothing_to_do_has_fix_null(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import H200

    log = tmp_path / "vllm.log"
    shutil.copy(H200 / "flashinfer-0.6.18-tune.log", log)
    r = run("--format", "json", "doctor", "--log", log, "--check", "log-summary")
    [f] = r.json()["findings"]
    assert f["check"] == "log-summary" and f["fix"] is None
    assert "fix:" not in run("doctor", "--log", log, "--check", "log-summary").out
