"""Turning data into text: tables, sizes, paths, JSON. Only the CLI calls this."""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from fi_cache.errors import EXIT_REFUSED

if TYPE_CHECKING:
    from fi_cache.caches.inventory import Inventory


def examples(*lines: str) -> str:
    """A command's --help epilog: real command lines, kept as written (click's \\b)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def short_date(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts))


def iso_time(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def short_gpu(name: str | None) -> str:
    from fi_cache.model.fingerprint import short_gpu_name  # not at import: --help stays light

    return "-" if not name else short_gpu_name(name)


# What ls shows of each cache before its size and path (files and tier keys alike).
CACHE_HEADERS = ["FLASHINFER", "ARCH", "GPU", "ENTRIES", "FINALIZE"]


def cache_cells(r: dict[str, Any]) -> list[str]:
    """One ls row's first columns, from the row's JSON (CACHE_HEADERS)."""
    return [
        r["flashinfer_version"] or "?",
        r["arch"] or "-",
        short_gpu(r["gpu"]),
        str(r["entries"]),
        r["finalize"] or "-",
    ]


# What a terminal acts on rather than shows: C0/C1 controls (ESC starts a title or clipboard
# escape sequence), DEL, bidi overrides. A lone surrogate is left to the streams' error handler
# (cli/__init__.py): a file name's undecodable byte goes out as that byte, pasteable.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNPRINTABLE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str, *, lines: bool = False) -> str:
    """`text` with every control character escaped (`\\x1b`): a key, a log's path or a
    metadata value goes to the terminal as text, never as a command to it. Every human
    renderer passes file-borne text through this. `lines`: a message's own line breaks stay."""
    pattern = _UNPRINTABLE_BUT_NEWLINE if lines else _UNPRINTABLE
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escaped, text)


def printable_rows(rows: list[list[str]]) -> list[list[str]]:
    """Table rows with every cell `printable`; one scan of all of them when none needs it."""
    if _UNPRINTABLE.search("".join("".join(row) for row in rows)) is None:
        return rows
    return [[printable(cell) for cell in row] for row in rows]


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def display_path(path: Path | str) -> str:
    """A path as the user pastes it into another command: whole (never cut), relative to the
    working dir when under it, `~` for home, shell-quoted when a shell would split it."""
    text = str(path)
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            text = rel
    except ValueError:
        pass
    import shlex

    if shlex.quote(text) != text:
        # no `~` inside quotes: the shell would not expand it
        return printable(shlex.quote(text))
    home = str(Path.home())
    if text.startswith(home + os.sep):
        text = "~" + text[len(home) :]
    return text


def terminal_width() -> int | None:
    """Columns when stdout is a terminal; None means do not truncate (pipes, files)."""
    import shutil

    return shutil.get_terminal_size((80, 24)).columns if sys.stdout.isatty() else None


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    right: Sequence[int] = (),
    width: int | None = None,
) -> str:
    """Aligned columns; the last column is cut from the left to fit `width` (pass no width when
    it holds something to paste, such as a path)."""
    if not rows:
        return ""
    cols = list(zip(headers, *rows, strict=True))
    widths = [max(len(c) for c in col) for col in cols]
    lines = []
    for row in (headers, *rows):
        cells = []
        for i, cell in enumerate(row):
            if i == len(row) - 1:
                cells.append(cell)
            elif i in right:
                cells.append(cell.rjust(widths[i]))
            else:
                cells.append(cell.ljust(widths[i]))
        line = "  ".join(cells)
        if width is not None and len(line) > width:
            keep = width - (len(line) - len(row[-1])) - 1
            if keep > 8:
                line = line[: len(line) - len(row[-1])] + "…" + row[-1][-keep:]
        lines.append(line.rstrip())
    return "\n".join(lines)


# A list longer than this is printed one item a line (each item compact, by json's C encoder):
# indent=2 runs json's pure-Python encoder, 12 s of `--format json diff` on 200,000 entries.
LONG_LIST = 1000


def emit_json(document: Any) -> None:
    click.echo(json_text(document))


def json_text(document: Any) -> str:
    """`document` as --format json prints it: indent=2, except that the items of a list longer
    than LONG_LIST take one line each (same JSON, and `jq`/`grep` friendly)."""
    import json
    import secrets

    long: list[Sequence[Any]] = []
    nonce = secrets.token_hex(8)  # a file's own strings cannot name a placeholder
    skeleton = _without_long_lists(document, long, nonce)
    text = json.dumps(skeleton, indent=2, sort_keys=False)
    for i, items in enumerate(long):
        mark = json.dumps(_mark(i, nonce))
        at = text.index(mark)
        indent = at - text.rfind("\n", 0, at) - 1
        line = text[at - indent : at]
        pad = " " * (len(line) - len(line.lstrip(" ")) + 2)
        body = ",\n".join(pad + json.dumps(item) for item in items)
        text = f"{text[:at]}[\n{body}\n{pad[:-2]}]{text[at + len(mark) :]}"
    return text


class Rows(Sequence[Any]):
    """A list for --format json whose items are made as they are printed (`make(item)`): a
    200,000-row diff never holds 200,000 dicts at once."""

    def __init__(self, items: Sequence[Any], make: Callable[[Any], Any]) -> None:
        self.items, self.make = items, make

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self.make(item) for item in self.items[i]]
        return self.make(self.items[i])

    def __iter__(self) -> Iterator[Any]:
        return map(self.make, self.items)


def _mark(i: int, nonce: str) -> str:
    return f"\0fi-cache-long-list-{nonce}-{i}\0"


def _without_long_lists(value: Any, long: list[Sequence[Any]], nonce: str) -> Any:
    if isinstance(value, dict):
        return {k: _without_long_lists(v, long, nonce) for k, v in value.items()}
    if isinstance(value, (list, tuple, Rows)):
        if len(value) > LONG_LIST:
            long.append(value)  # printed item by item, by json's C encoder
            return _mark(len(long) - 1, nonce)
        return [_without_long_lists(v, long, nonce) for v in value]
    return value


def _quiet() -> bool:
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(getattr(obj, "quiet", False))


def warn(message: str) -> None:
    """A note or warning on stderr; `-q` silences it."""
    if not _quiet():
        click.echo(f"fi-cache: {printable(message, lines=True)}", err=True)


def error(message: str) -> None:
    """A problem the command reports (it sets the exit code): shown even with `-q`."""
    click.echo(f"fi-cache: {printable(message, lines=True)}", err=True)


def report_scan_problems(inv: Inventory) -> int:
    """Print each problem a scan met on one line; return the exit code they call for."""
    code = 0
    for p in inv.problems:
        error(f"{p.path}: {p.message}")  # error() escapes the path's control characters
        code = max(code, p.exit_code)
    for path in inv.empty:
        error(f"{path}: no FlashInfer autotune caches found here")
        code = EXIT_REFUSED
    return code


def terminal_width_stderr() -> int:
    import shutil

    return shutil.get_terminal_size((80, 24)).columns
