"""JSON that no FlashInfer or fi-cache writer produces, though `json.loads` accepts it.

- Nesting deeper than `MAX_DEPTH`: FlashInfer's deepest value, `[runner, [plan, [[k, v]]],
  policy, selection]`, is 5 levels under the top object. Deeper input only feeds the recursion
  of whatever reads it next (a RecursionError far from the file it came from).
- A lone UTF-16 surrogate (`"\\ud800"`): valid JSON, but not Unicode text. FlashInfer writes
  names and versions it got from CUDA and Python, which never hold one, and printing or
  encoding one fails (UnicodeEncodeError), so one such file would break `ls` for a whole store.

Every reader of cache files, v2 manifests and entries, namespace manifests and bundle manifests
calls `problem` once on what it parsed and treats an answer as a corrupt file. Cache files are
decoded by `text` first: FlashInfer opens them as UTF-8 text, while `json.loads(bytes)` also
takes UTF-16/32, a BOM, and raw surrogate bytes (which `problem`'s escape scan cannot see).
"""

from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 32
# `\uD800`-`\uDFFF` as JSON writes them; without one in the text no string can hold a surrogate.
_ESCAPED_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_ESCAPED_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SHOWN = 40  # characters of a key or string quoted in a message


class NotUtf8(ValueError):
    """Bytes FlashInfer's `open(path, encoding="utf-8")` cannot decode."""


def text(raw: str | bytes) -> str:
    """`raw` decoded as FlashInfer decodes a cache file: strict UTF-8. Raises NotUtf8 naming
    the first bad byte (UTF-16, raw surrogate bytes); a BOM is left for json to refuse."""
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def problem(data: Any, raw: str | bytes | None = None) -> str | None:
    """Why parsed JSON `data` cannot be a file FlashInfer or fi-cache wrote, as one line, or None.

    Pass the text it was parsed from as `raw` when there is one: strings are then searched only
    if the text holds a surrogate escape (one regex scan, the common case).
    """
    if raw is None:
        strings = True
    elif isinstance(raw, bytes):
        strings = _ESCAPED_SURROGATE_BYTES.search(raw) is not None
    else:
        strings = _ESCAPED_SURROGATE.search(raw) is not None
    if strings:
        return _walk_strings(data)
    return _too_deep(data)


def shown(text: str) -> str:
    """`text` quoted so that it can be printed: repr escapes surrogates (`'\\ud800'`); cut short."""
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…")


def _deep_message() -> str:
    return f"JSON nested deeper than {MAX_DEPTH} levels (no FlashInfer cache nests like that)"


def _too_deep(data: Any) -> str | None:
    """Containers only, depth-first; a 2-element `[str, int]` (most v1 entry values) is a leaf."""
    if type(data) is not dict and type(data) is not list:
        return None
    stack = [(data, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        if depth > MAX_DEPTH:
            return _deep_message()
        for value in node.values() if type(node) is dict else node:
            kind = type(value)
            if kind is list:
                if (
                    depth < MAX_DEPTH
                    and len(value) == 2
                    and type(value[0]) is str
                    and type(value[1]) is int
                ):
                    continue
                push((value, depth + 1))
            elif kind is dict:
                push((value, depth + 1))
    return None


def _walk_strings(data: Any) -> str | None:
    """Depth and every string (keys too), naming where the first surrogate sits."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(data, 1, ())]
    while stack:
        node, depth, where = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                return _surrogate_message(where, node)
            continue
        if not isinstance(node, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            return _deep_message()
        if isinstance(node, dict):
            for key, value in node.items():
                if _SURROGATE.search(key):
                    return _surrogate_message(where, key, is_key=True)
                stack.append((value, depth + 1, (*where, "/" + shown(key)[1:-1])))
        else:
            stack.extend((v, depth + 1, (*where, f"[{i}]")) for i, v in enumerate(node))
    return None


def _surrogate_message(where: tuple[str, ...], text: str, *, is_key: bool = False) -> str:
    place = "".join(where).removeprefix("/")
    what = "key" if is_key else "string"
    at = f" in {place}" if place else ""
    return (
        f"{what} {shown(text)}{at} holds a lone UTF-16 surrogate: not Unicode text, "
        "so no FlashInfer wrote it"
    )
