"""The option strings of `vllm serve` that take no value, read from a release wheel's own code
(its argparse calls and the config dataclasses they derive flags from) with `ast`: nothing of
vLLM is imported (0.33/0.34 have no CPU build).

What vLLM does, and this reads: `add_argument(..., action="store_true"/"store_false"/
BooleanOptionalAction)` in engine/arg_utils.py and entrypoints/common/cli_args.py, and
`add_argument("--x", **X_kwargs["field"])` with `X_kwargs = get_kwargs(Config)`, where
`_compute_kwargs` (engine/arg_utils.py 0.34:323-436) makes a field typed `bool` (but not
`bool | str | None`, an optional value) a BooleanOptionalAction; the frontend's fields are added
the same way by `BaseFrontendArgs.add_cli_args` (entrypoints/common/cli_args.py 0.34:264-288).
FlexibleArgumentParser registers BooleanOptionalAction as EnableDisableAction
(utils/argparse_utils.py 0.34:120-145, 179): `--X` also answers to `--no-X`, and `--enable-Y`
to `--disable-Y`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache

from tests.vllm_wheels import unpacked

_SOURCES = ("vllm/engine/arg_utils.py", "vllm/entrypoints/common/cli_args.py")
_VALUELESS_ACTIONS = {"store_true", "store_false", "store_const", "count", "help", "version"}


@dataclass(frozen=True)
class Flags:
    valueless: frozenset[str]  # the option strings vLLM takes alone, as given to add_argument
    valued: frozenset[str]  # the other option strings


def _negations(names: list[str]) -> set[str]:
    out = {f"--no-{n[2:]}" for n in names if n.startswith("--")}
    for n in names:
        for a, b in (("--enable-", "--disable-"), ("--disable-", "--enable-")):
            if n.startswith(a):
                out.add(b + n.removeprefix(a))
    return out


@cache
def _classes(version: str) -> dict[str, list[ast.ClassDef]]:
    root = unpacked(version) / "vllm"
    out: dict[str, list[ast.ClassDef]] = {}
    for path in [*root.joinpath("config").rglob("*.py"), *(root / s[5:] for s in _SOURCES)]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, []).append(node)
    return out


def _annotation(version: str, cls: str, field: str) -> str | None:
    """The field's annotation in the class or its bases, as source text."""
    for node in _classes(version).get(cls, []):
        for stmt in node.body:
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == field
            ):
                return ast.unparse(stmt.annotation)
        for base in node.bases:
            if isinstance(base, ast.Name) and (found := _annotation(version, base.id, field)):
                return found
    return None


def _is_bool_field(annotation: str) -> bool:
    """`_compute_kwargs`: `bool | str | None` is an optional value; any other union with bool
    is a BooleanOptionalAction."""
    members = {m.strip() for m in annotation.replace("Optional[", "").rstrip("]").split("|")}
    return "bool" in members and members != {"bool", "str", "None"}


def _fields(version: str, cls: str) -> dict[str, str]:
    """Every annotated field of `cls` and its bases (base first), with its annotation."""
    out: dict[str, str] = {}
    for node in _classes(version).get(cls, []):
        for base in node.bases:
            if isinstance(base, ast.Name):
                out.update(_fields(version, base.id))
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                out[stmt.target.id] = ast.unparse(stmt.annotation)
    return out


def _kwargs_sources(tree: ast.AST) -> dict[str, str]:
    """`X_kwargs = get_kwargs(Config)` assignments: X_kwargs -> Config."""
    out = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "get_kwargs"
            and isinstance(node.value.args[0], ast.Name)
        ):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.args[0].id
    return out


def _action(call: ast.Call) -> str | None:
    for kw in call.keywords:
        if kw.arg == "action":
            if isinstance(kw.value, ast.Constant):
                return str(kw.value.value)
            if isinstance(kw.value, ast.Attribute):
                return kw.value.attr
            if isinstance(kw.value, ast.Name):
                return kw.value.id
    return None


def _derived_field(version: str, call: ast.Call, sources: dict[str, str]) -> bool | None:
    """For `**X_kwargs["field"]` (or `**get_kwargs(C)["field"]`): whether the field is a bool
    flag; None when the call takes no such kwargs."""
    spread = [kw.value for kw in call.keywords if kw.arg is None]
    for value in list(spread):  # **{**X_kwargs["field"], "default": None}
        if isinstance(value, ast.Dict):
            spread += [v for k, v in zip(value.keys, value.values, strict=True) if k is None]
    for value in spread:
        if not isinstance(value, ast.Subscript):
            continue
        holder, key = value.value, value.slice
        if not isinstance(key, ast.Constant):
            continue
        cls = None
        if isinstance(holder, ast.Name):
            cls = sources.get(holder.id)
        elif isinstance(holder, ast.Subscript) and isinstance(holder.value, ast.Name):
            cls = sources.get(holder.value.id)  # get_kwargs(VllmConfig)["x"] kept in a name
        if cls is None:
            continue
        annotation = _annotation(version, cls, str(key.value))
        return annotation is not None and _is_bool_field(annotation)
    return None


@cache
def serve_flags(version: str) -> Flags:
    root = unpacked(version)
    valueless: set[str] = set()
    valued: set[str] = set()
    for source in _SOURCES:
        tree = ast.parse((root / source).read_text())
        sources = _kwargs_sources(tree)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
            ):
                continue
            names = [
                a.value
                for a in node.args
                if isinstance(a, ast.Constant) and str(a.value).startswith("-")
            ]
            if not names:
                continue  # a positional, or the frontend's f"--{key}" loop (below)
            action = _action(node)
            if action in _VALUELESS_ACTIONS:
                valueless.update(names)
            elif action in ("BooleanOptionalAction", "EnableDisableAction") or (
                action is None and _derived_field(version, node, sources)
            ):
                valueless.update(names, _negations(names))
            else:
                valued.update(names)
    for field, annotation in _fields(version, "FrontendArgs").items():
        name = f"--{field.replace('_', '-')}"
        if _is_bool_field(annotation):
            valueless.update([name], _negations([name]))
        else:
            valued.add(name)
    valueless.update({"-h", "--help"})
    return Flags(frozenset(valueless), frozenset(valued - valueless))
