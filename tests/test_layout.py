"""The layout docs/design.md promises: which package may import which, no import cycles between
commands, and only fi_cache/store/ writing to disk. Read from the source (ast), so a change that
breaks a rule fails here, naming the module and the line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "fi_cache"
_BOTTOM = {"errors", "versions", "model"}
# Each top-level part of fi_cache and the parts it may import (besides itself).
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "versions": set(),
    "model": {"errors", "versions"},
    "store": _BOTTOM,
    "caches": _BOTTOM,
    # issue 44's pure rules over timings (verdicts, robust winners): the tuning child's and bench's
    "tuning": _BOTTOM,
    "environment": _BOTTOM | {"store"},
    "ranks": _BOTTOM | {"caches"},
    "engines": _BOTTOM | {"store", "caches", "environment", "ranks", "tuning"},
    "doctor": _BOTTOM | {"store", "caches", "environment", "engines", "ranks"},
    "maintenance": _BOTTOM | {"store", "caches", "environment", "ranks", "tuning"},
    # An import keeps this node's rank files with maintenance's align.
    "fleet": _BOTTOM | {"store", "caches", "environment", "ranks", "maintenance"},
    # serve --pull imports the fleet's bundle before the checks.
    "lifecycle": _BOTTOM
    | {"store", "caches", "environment", "engines", "doctor", "maintenance", "ranks", "fleet"},
    # vLLM 0.34's Mooncake tier: reads tables as caches do, judges them with doctor's checks
    "tier": _BOTTOM | {"store", "caches", "doctor"},
    "cli": _BOTTOM
    | {"store", "caches", "environment", "engines", "doctor", "maintenance", "fleet", "lifecycle"}
    | {"ranks", "tier", "tuning"},
    "__init__": set(),
    "__main__": {"cli", "lifecycle", "store", "errors"},
}


def _modules() -> Iterator[tuple[str, Path]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield ".".join(parts), path


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported fi_cache module or name) for every import, lazy ones included."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fi_cache"):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([base] if base else [])])
            if base.startswith("fi_cache"):
                for alias in node.names:
                    yield node.lineno, f"{base}.{alias.name}"


def _part(dotted: str) -> str:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = dict(_modules())


def _resolve(name: str) -> str | None:
    """The fi_cache module `name` is (a name imported from a module resolves to that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def test_each_part_imports_only_the_parts_below_it() -> None:
    wrong = []
    for module, path in MODULES.items():
        mine = _part(module)
        if module == "fi_cache":
            continue  # the package's own __init__: the version string only
        for line, name in _imports(module, path):
            target = _resolve(name)
            if target is None or target == "fi_cache":
                continue  # `from fi_cache import __version__`
            theirs = _part(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {mine} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_engines_do_not_import_each_other() -> None:
    wrong = []
    for module, path in MODULES.items():
        parts = module.split(".")
        if parts[1:2] != ["engines"] or len(parts) < 4:
            continue
        for line, name in _imports(module, path):
            target = (_resolve(name) or "").split(".")
            other = target[2] if target[1:2] == ["engines"] and len(target) > 2 else parts[2]
            shared = ("api", "guard", "server", "scripts", "hf", "__init__")  # all engines
            if other not in (parts[2], *shared):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: imports {'.'.join(target)}")
    assert not wrong, "\n".join(wrong)


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle anywhere in fi_cache, lazy imports included (a package's __init__ counts
    as the module its names come from)."""
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        deps = {_resolve(n) for _, n in _imports(module, path)}
        graph[module] = {d for d in deps if d and d not in (module, "fi_cache")}
    graph["fi_cache.cli"] = set()  # the group registers every command; commands use its Context

    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for m in graph if (c := cycle_from(m))]
    assert not cycles, " -> ".join(cycles[0])


MAX_LINES = 600  # a module a newcomer reads in one sitting


def test_every_module_reads_in_one_sitting() -> None:
    long = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    ]
    assert not long, "\n".join(long)


def test_every_command_has_a_module_named_after_it() -> None:
    from fi_cache.cli import load_all

    pairs = {"export": "bundle", "import": "bundle", "push": "push_pull", "pull": "push_pull"}
    pairs["unpin"] = "pin"
    for name, command in load_all().items():
        assert command.callback is not None
        module = command.callback.__module__
        assert module == f"fi_cache.cli.{pairs.get(name, name)}", (name, module)


# Calls that change the disk. Outside fi_cache/store/ each one needs a reason here.
_WRITES = {
    ("os", "replace"),
    ("os", "rename"),
    ("os", "unlink"),
    ("os", "remove"),
    ("os", "rmdir"),
    ("os", "chmod"),
    ("os", "mkdir"),
    ("os", "makedirs"),
    ("shutil", "move"),
    ("shutil", "rmtree"),
    ("shutil", "copy"),
    ("shutil", "copyfile"),
    ("tempfile", "mkstemp"),
    ("tempfile", "mkdtemp"),
}
_WRITE_METHODS = {"mkdir", "write_text", "write_bytes", "unlink", "rmdir", "touch", "rename"}
_ALLOWED_WRITES = {
    # stdout duplicated for the JSON-lines protocol: a pipe, not a file
    ("fi_cache/engines/flashinfer/__main__.py", "open:w"),
    ("fi_cache/tier/worker.py", "open:w"),
    # a bundle is built in memory (BytesIO); the store writes it to disk
    ("fi_cache/fleet/bundle.py", "open:w:gz"),
    # push writes to the remote URL through fsspec, never into the store
    ("fi_cache/fleet/transfer.py", "open:wb"),
}


def _writes(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            if (owner, func.attr) in _WRITES:
                yield node.lineno, f"{owner}.{func.attr}"
            elif func.attr in _WRITE_METHODS and owner not in ("os", "shutil"):
                yield node.lineno, f".{func.attr}"
        mode = _open_mode(node)
        if mode and any(c in mode for c in "wax+"):
            yield node.lineno, f"open:{mode}"


def _open_mode(call: ast.Call) -> str | None:
    name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
    if name not in ("open", "fdopen"):
        return None
    args = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "mode")]
    for arg in args:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
    return None


@pytest.mark.parametrize(
    "path",
    [p for p in sorted(PACKAGE.rglob("*.py")) if "store" not in p.relative_to(PACKAGE).parts[:1]],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_store_writes_to_disk(path: Path) -> None:
    rel = str(path.relative_to(ROOT))
    found = [f"{rel}:{line}: {w}" for line, w in _writes(path) if (rel, w) not in _ALLOWED_WRITES]
    assert not found, "\n".join(found)
