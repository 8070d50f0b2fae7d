"""Which Python runs an engine's console script (`vllm`, `sglang`): the packages of that
interpreter, not fi-cache's own (a pipx install), name the namespace. Also how a pasted engine
command line (`vllm serve ARGS`, `PYTHON -m MODULE ARGS`) names the engine to run."""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Sequence

PYTHON_NAME = re.compile(r"python[0-9.]*")


def runs_module(words: list[str], module: str) -> bool:
    """Whether `words` start with `PYTHON -m module` (a pasted engine line's launcher)."""
    return words[1:3] == ["-m", module] and bool(PYTHON_NAME.fullmatch(os.path.basename(words[0])))


# pip's launcher for interpreter paths too long for a `#!` line: '''exec' "/path/python" "$0" "$@"
_SH_EXEC = re.compile(rb"^'''exec' \"([^\"]+)\" \"\$0\"")


def interpreter(executable: str) -> str | None:
    """The Python that runs `executable` (an engine's console script), so that facts about the
    engine come from the environment that runs it: itself when it is a Python, else what its
    `#!` line (or pip's long-path launcher) names. None for anything else, e.g. a shell wrapper."""
    if PYTHON_NAME.fullmatch(os.path.basename(executable)):
        return executable
    try:
        with open(executable, "rb") as f:
            head = f.read(1024).splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith(b"#!"):
        return None
    words = head[0][2:].decode(errors="replace").split()
    found: str | None = None
    if words and os.path.basename(words[0]) == "env":
        names = [w for w in words[1:] if not w.startswith("-")]
        found = shutil.which(names[0]) if names else None
    elif words:
        found = words[0]
    if found and os.path.basename(found) == "sh" and len(head) > 1:
        m = _SH_EXEC.match(head[1])
        found = m.group(1).decode(errors="replace") if m else None
    if found and PYTHON_NAME.fullmatch(os.path.basename(found)) and os.access(found, os.X_OK):
        return found
    return None


def resolve_launcher(
    explicit: str | None, variable: str, default: str, module: str, what: str, flag: str
) -> tuple[str, bool]:
    """(The program to start, whether it runs `-m module`): `flag CMD`, else $variable, else
    `default` on PATH. CMD is the engine's executable, a Python (run with `-m module`), or that
    module form spelled out. Raises Refused naming `what` and where CMD came from."""
    from fi_cache.errors import Refused

    spec = explicit or os.environ.get(variable) or default
    where = flag if explicit else (variable if os.environ.get(variable) else "PATH")
    try:
        words = shlex.split(spec) if " " in spec.strip() else [spec]
    except ValueError as exc:  # an unbalanced quote
        raise Refused(f"{spec!r} (from {where}): {exc}") from None
    found = shutil.which(words[0]) if words else None
    if found is None:
        fix = (
            f"give {flag} the {what} executable or a Python that imports it"
            if explicit or os.environ.get(variable)
            else f"install {what} or pass {flag} PATH"
        )  # "pass --vllm" to whoever just passed --vllm helps nobody
        raise Refused(f"no {what} executable {spec!r} (from {where}); {fix}")
    rest = words[1:]
    if rest and rest != ["-m", module]:
        raise Refused(
            f"{spec!r} (from {where}): give the {what} executable, a Python, or "
            f"`PYTHON -m {module}`"
        )
    return found, bool(rest) or bool(PYTHON_NAME.fullmatch(os.path.basename(found)))


def pasted_launcher(
    path: str | None,
    argv: Sequence[str],
    split_launcher: Callable[[Sequence[str]], tuple[list[str] | None, list[str]]],
    find_launcher: Callable[[str], object],
    flag: str,
    what: str,
) -> tuple[str | None, tuple[str, ...]]:
    """(The engine to run, its arguments) from a pasted engine command line (`split_launcher`
    finds its launcher): that launcher is the one to run, and a `flag` naming another is
    refused."""
    from fi_cache.errors import Refused

    words, rest = split_launcher(argv)
    if not words:
        return path, tuple(rest)
    pasted = shlex.join(words)
    if path is not None and find_launcher(path) != find_launcher(pasted):
        raise Refused(f"{flag} {path} and the pasted `{pasted}` name two {what}s; give one")
    return pasted, tuple(rest)
