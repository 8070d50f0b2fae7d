"""FlashInfer cache keys: `str((custom_op, runner, profile, extras))`, parsed without eval.

FlashInfer never parses its keys (it compares strings), so the grammar is "whatever Python's
repr of these tuples prints": tuples, lists, ints (negative too), floats, quoted strings, bools,
None, `torch.<dtype>` and `torch.Size([...])`. `ast.literal_eval` rejects the torch parts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

# Deeper nesting than this is hostile input, not a key FlashInfer wrote (real keys nest 3 deep).
MAX_DEPTH = 32
# FlashInfer's longest keys have ~250 characters (fused MoE, tests/fixtures): longer is hostile.
MAX_KEY_CHARS = 64 * 1024


@dataclass(frozen=True)
class Symbol:
    """A bare dotted name in a key, e.g. `torch.bfloat16` (a dtype's repr)."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class TorchSize:
    """`torch.Size([d0, d1, ...])` as printed inside a key."""

    dims: tuple[int, ...]

    def __repr__(self) -> str:
        return f"torch.Size([{', '.join(map(str, self.dims))}])"


# Recursive alias: Union[] because `|` cannot join a string forward reference on Python 3.10.
KeyValue = Union[  # noqa: UP007
    int, float, str, bool, None, Symbol, TorchSize, tuple["KeyValue", ...], list["KeyValue"]
]


@dataclass(frozen=True)
class CacheKey:
    """One parsed entry key. `extras` is None for the 3-tuple keys of FlashInfer <= 0.6.12."""

    op: str
    runner: str
    profile: KeyValue
    extras: KeyValue
    has_extras: bool


class KeyError_(ValueError):
    """A key that does not parse; the message says where and why."""


_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<str>'[^'\\\n]*(?:\\.[^'\\\n]*)*'|"[^"\\\n]*(?:\\.[^"\\\n]*)*")
  | (?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?)
  | (?P<name>[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)
  | (?P<punct>[()\[\],])
  """,
    re.VERBOSE,
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{1,3}|.)", re.DOTALL)
_SIMPLE_ESCAPES = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "v": "\v",
    "\n": "",
}
_KEYWORDS: dict[str, KeyValue] = {"True": True, "False": False, "None": None}


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    if code[0] in "xuU":
        return chr(int(code[1:], 16))
    if code[0] in "01234567":
        return chr(int(code, 8))
    if code in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[code]
    raise KeyError_(f"unknown escape \\{code} in a string")


def _decode_string(token: str) -> str:
    body = token[1:-1]
    if "\\" not in body:
        return body
    try:
        return _ESCAPE.sub(_unescape, body)
    except KeyError_:
        raise
    except (ValueError, OverflowError):  # \UFFFFFFFF: past the last code point
        raise KeyError_("escape beyond the last Unicode code point") from None


def _tokenize(text: str) -> list[tuple[str, str, int]]:
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise KeyError_(f"unexpected {text[pos]!r} at column {pos + 1}")
        kind = m.lastgroup or ""
        if kind != "ws":
            tokens.append((kind, m.group(), pos))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.i = 0
        self.end = len(text)

    def _peek(self) -> tuple[str, str, int]:
        return self.tokens[self.i] if self.i < len(self.tokens) else ("end", "", self.end)

    def _take(self, text: str) -> None:
        _, value, pos = self._peek()
        if value != text:
            shown = repr(value) if value else "end of key"
            raise KeyError_(f"expected {text!r} at column {pos + 1}, found {shown}")
        self.i += 1

    def value(self, depth: int = 0) -> KeyValue:
        if depth > MAX_DEPTH:
            raise KeyError_(f"nested deeper than {MAX_DEPTH} levels")
        kind, text, pos = self._peek()
        self.i += 1
        if kind == "str":
            return _decode_string(text)
        if kind == "num":
            try:
                return float(text) if any(c in text for c in ".eE") else int(text)
            except ValueError:  # past Python's 4300-digit limit: no key FlashInfer wrote
                raise KeyError_(f"number at column {pos + 1} is too long") from None
        if kind == "name":
            if text in _KEYWORDS:
                return _KEYWORDS[text]
            if text == "torch.Size":
                return self._torch_size(depth)
            return Symbol(text)
        if text == "(":
            items = self._sequence(")", depth)
            return tuple(items)
        if text == "[":
            return self._sequence("]", depth)
        shown = repr(text) if text else "end of key"
        raise KeyError_(f"expected a value at column {pos + 1}, found {shown}")

    def _sequence(self, close: str, depth: int) -> list[KeyValue]:
        items: list[KeyValue] = []
        trailing_comma = False
        while self._peek()[1] != close:
            items.append(self.value(depth + 1))
            trailing_comma = self._peek()[1] == ","
            if not trailing_comma:
                break
            self.i += 1
        self._take(close)
        if close == ")" and len(items) == 1 and not trailing_comma:
            raise KeyError_("a parenthesised value without a comma is not a tuple")
        return items

    def _torch_size(self, depth: int) -> TorchSize:
        self._take("(")
        dims = self.value(depth + 1)
        self._take(")")
        if not isinstance(dims, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) for d in dims
        ):
            raise KeyError_("torch.Size(...) must hold a list of ints")
        return TorchSize(tuple(dims))  # type: ignore[arg-type]

    def done(self) -> None:
        kind, text, pos = self._peek()
        if kind != "end":
            raise KeyError_(f"unexpected {text!r} after the key at column {pos + 1}")


def parse_value(text: str) -> KeyValue:
    """Parse one repr'd value (a key or any part of one)."""
    if len(text) > MAX_KEY_CHARS:
        raise KeyError_(
            f"{len(text):,} characters long, over the {MAX_KEY_CHARS:,} a key may have "
            "(FlashInfer's are a few hundred)"
        )
    parser = _Parser(text)
    result = parser.value()
    parser.done()
    return result


def parse_key(text: str) -> CacheKey:
    """Parse an entry key; raise KeyError_ with a one-line reason when it is not one."""
    if "\\" not in text and len(text) <= MAX_KEY_CHARS:
        build = _builder(text.encode("utf-8", "surrogatepass").translate(_DIGITS))
        if build is not None:
            try:
                return build(text)
            except ValueError:  # a number past Python's digit limit: the parser says so
                pass
    return _checked_key(parse_value(text))


def _checked_key(value: KeyValue) -> CacheKey:
    if not isinstance(value, tuple) or len(value) not in (3, 4):
        raise KeyError_("a key is a tuple of (op, runner, profile[, extras])")
    op, runner, profile = value[0], value[1], value[2]
    if not isinstance(op, str) or not isinstance(runner, str):
        raise KeyError_("the op and runner names must be strings")
    if not isinstance(profile, tuple):
        raise KeyError_("the profile must be a tuple of shapes")
    has_extras = len(value) == 4
    return CacheKey(op, runner, profile, value[3] if has_extras else None, has_extras)


def format_value(value: KeyValue) -> str:
    """Python's repr of a parsed value, so `format_value(parse_value(repr(x))) == repr(x)`."""
    if isinstance(value, tuple):
        inner = ", ".join(format_value(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return repr(value)


def format_key(key: CacheKey) -> str:
    parts: tuple[KeyValue, ...] = (key.op, key.runner, key.profile)
    return format_value((*parts, key.extras) if key.has_extras else parts)


def shapes(profile: KeyValue | object) -> str:
    """A profile's shapes as `1x4096 4096x2048 0 -1x2048`: one token per input, dims joined by
    x (a parsed key's profile, or its JSON view)."""
    if not isinstance(profile, (tuple, list)):
        return str(to_json(profile))  # type: ignore[arg-type]
    parts = []
    for shape in profile:
        if type(shape) is tuple or type(shape) is list:
            # str() of a plain leaf is its JSON view's; a nested value's has a bracket.
            text = "x".join(map(str, shape)) if shape else "()"
            if shape and ("(" in text or "[" in text):
                text = "x".join(str(d) for d in _json_list(shape))
            parts.append(text)
        elif isinstance(shape, TorchSize):
            parts.append("x".join(map(str, shape.dims)) if shape.dims else "()")
        else:
            parts.append(str(to_json(shape)))
    return " ".join(parts)


_PLAIN = (int, float, str, bool, type(None))


def _json_list(value: tuple[KeyValue, ...] | list[KeyValue]) -> list[object]:
    return [to_json(v) for v in value]


def to_json(value: KeyValue) -> object:
    """A JSON-friendly view: tuples become lists, torch symbols their printed names."""
    if type(value) is tuple or type(value) is list:
        # Plain leaves (most of a profile) are taken as they are, without a call each.
        return [v if type(v) in _PLAIN else to_json(v) for v in value]
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, TorchSize):
        return list(value.dims)
    if isinstance(value, Symbol):
        return value.name
    return value


# Fast batch check for 100,000-entry files. Replacing every digit 1-9 by 0 changes no token's kind
# (numbers stay numbers, names stay names, hex/octal escapes stay valid), so a key parses iff its
# digit-normalised "signature" does; a big file has few distinct signatures, each parsed once.
# Keys with a backslash are parsed one by one ("\\8" is no escape, "\\0" is).
_DIGITS = bytes.maketrans(b"123456789", b"000000000")
_HEAD = re.compile(
    r"^\('([^'\\\n]*(?:\\.[^'\\\n]*)*)', '([^'\\\n]*(?:\\.[^'\\\n]*)*)', (?=\()", re.MULTILINE
)


def signature(raw: str) -> bytes:
    """The key with every digit 1-9 replaced by 0: keys that differ only in shapes share it."""
    return raw.encode("utf-8", "surrogatepass").translate(_DIGITS)


def _signatures(keys: Sequence[str]) -> list[bytes]:
    """signature() of every key, in one C-level pass over all of them when possible."""
    joined = "\n".join(keys).encode("utf-8", "surrogatepass").translate(_DIGITS)
    sigs = joined.split(b"\n")
    return sigs if len(sigs) == len(keys) else [signature(k) for k in keys]


def key_heads(keys: Sequence[str]) -> list[tuple[str, str]] | None:
    """(op, runner) of every key via one regex pass, or None when some key needs the slow path."""
    if not keys:
        return []
    joined = "\n".join(keys)
    if joined.count("\n") != len(keys) - 1 or "\\" in joined:
        return None
    heads = _HEAD.findall(joined)
    return heads if len(heads) == len(keys) else None


def _why_not(raw: str) -> str | None:
    try:
        parse_key(raw)
    except KeyError_ as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=8192)
def _signature_parses(sig: bytes) -> bool:
    # Shared across files: caches of one model repeat a few signatures many times over.
    return _why_not(sig.decode("utf-8", "surrogatepass")) is None


def find_unparsable(keys: Sequence[str]) -> dict[int, str]:
    """Index -> reason for every key that does not parse. Empty when all do."""
    sigs = _signatures(keys)
    suspect = {sig for sig in set(sigs) if b"\\" in sig or not _signature_parses(sig)}
    if not suspect:
        return {}
    problems: dict[int, str] = {}
    for i, sig in enumerate(sigs):
        if sig in suspect and (why := _why_not(keys[i])) is not None:
            problems[i] = why
    return problems


# --- Keys that differ only in digits, built without parsing (show/diff/coverage of 200,000) ----
# Digits 1-9 -> 0 keeps every token's kind and column (see `signature`), so a key's value is its
# signature's tree with the digit-bearing leaves read from the key's own text at the same
# columns. Each signature seen twice gets a builder: a lambda compiled from that tree, whose
# source holds only slices, int()/float(), repr'd constants and the two torch classes.
_BUILDERS_MAX = 8192
_builders: dict[bytes, Callable[[str], CacheKey] | None] = {}
_seen_once: set[bytes] = set()


def _builder(sig: bytes) -> Callable[[str], CacheKey] | None:
    """The compiled builder of keys with this signature; None while it was seen only once
    (a one-off key is parsed: compiling would cost more) or when it is no key."""
    if sig in _builders:
        return _builders[sig]
    if sig not in _seen_once:
        if len(_seen_once) >= 8 * _BUILDERS_MAX:
            _seen_once.clear()
        _seen_once.add(sig)
        return None
    if len(_builders) >= _BUILDERS_MAX:
        _builders.clear()
        _shape_texts.clear()
    text = sig.decode("utf-8", "surrogatepass")
    _builders[sig] = built = _compile(text)
    _shape_texts[sig] = _compile_shapes(text) if built is not None else None
    return built


# `shapes(profile)` straight from a key's text, for keys whose profile is tuples of ints: an
# f-string of str(int(slice)) of each dim (so 007 and -0 print as the parsed key's 7 and 0).
_shape_texts: dict[bytes, Callable[[str], str] | None] = {}


def shapes_text(raw: str) -> str | None:
    """`shapes(parse_key(raw).profile)` without the parsed profile, or None where this cannot
    tell (a shape seen once, a profile of other values)."""
    if "\\" in raw:
        return None
    build = _shape_texts.get(raw.encode("utf-8", "surrogatepass").translate(_DIGITS))
    if build is None:
        return None
    return build(raw)


def profile_order(profile: KeyValue, text: str) -> tuple[int, Any]:
    """Sort key of a profile (its shapes `text`): (0, the profile) when it is tuples of ints,
    as `key_row` gives it, so all such keys sort numerically together; else (1, `text` in
    numeric order)."""
    from fi_cache.model.buckets import shape_order

    if type(profile) is tuple and all(
        type(s) is tuple and all(type(d) is int for d in s) for s in profile
    ):
        return (0, profile)
    return (1, shape_order(text))


# A row of show/diff straight from a key's text: (op, runner, shapes text, profile as tuples of
# ints, extras as show prints them: "[1,2048,4096,torch.bfloat16]", "-" without extras), for
# keys of plain int shapes and a flat extras sequence. None: read the parsed key instead.
KeyRow = tuple[str, str, str, tuple[tuple[int, ...], ...], str]
_rows: dict[bytes, Callable[[str], KeyRow] | None] = {}


def key_row(raw: str) -> KeyRow | None:
    """`(op, runner, shapes(profile), profile, extras text)` of a key seen before in this shape,
    without parsing it; None where that cannot be told from the text (see `shapes_text`)."""
    if "\\" in raw:
        return None
    sig = raw.encode("utf-8", "surrogatepass").translate(_DIGITS)
    if sig in _rows:
        build = _rows[sig]
    elif _builder(sig) is None:  # seen once, or no key: the caller parses it
        return None
    else:
        if len(_rows) >= _BUILDERS_MAX:
            _rows.clear()
        build = _rows[sig] = _compile_row(sig.decode("utf-8", "surrogatepass"))
    return None if build is None else build(raw)


def _str_code(token: tuple[str, str, int]) -> str:
    _, text, pos = token
    return repr(_decode_string(text)) if "0" not in text else f"t[{pos + 1}:{pos + len(text) - 1}]"


def _compile_row(sig: str) -> Callable[[str], KeyRow] | None:
    tokens = _tokenize(sig)
    if len(tokens) < 7 or tokens[5][1] != "(":
        return None
    shapes: list[str] = []
    dims_code: list[str] = []
    numbers: list[str] = []  # int(slice) of each number, once: n0, n1, ... below

    def number(token: tuple[str, str, int]) -> str:
        _, text, pos = token
        numbers.append(f"int(t[{pos}:{pos + len(text)}])")
        return f"n{len(numbers) - 1}"

    i = 6
    while tokens[i][1] == "(":
        texts, ints, i = [], [], i + 1
        while tokens[i][0] == "num" and not any(c in tokens[i][1] for c in ".eE"):
            name = number(tokens[i])
            texts.append(f"{{{name}}}")  # str(int): 007 and -0 print as the parsed key's
            ints.append(f"{name}, ")
            i += 1
            if tokens[i][1] == ",":
                i += 1
        if tokens[i][1] != ")":
            return None
        shapes.append("x".join(texts) if texts else "()")
        dims_code.append(f"({''.join(ints)})")
        i += 1
        if tokens[i][1] == ",":
            i += 1
    if tokens[i][1] != ")" or not shapes:
        return None
    i += 1
    extras = "'-'"
    if tokens[i][1] == ",":  # the 4-tuple of FlashInfer >= 0.6.13: (…, extras)
        if tokens[i + 1][1] not in ("(", "["):
            return None
        close = ")" if tokens[i + 1][1] == "(" else "]"
        items, i = [], i + 2
        while tokens[i][1] != close:
            kind, text, pos = tokens[i]
            if kind == "num" and not any(c in text for c in ".eE"):
                items.append(f"{{{number(tokens[i])}}}")
            elif kind == "name" and text != "torch.Size":
                named = str(_KEYWORDS[text]) if text in _KEYWORDS else text
                items.append(named if "0" not in text else f"{{t[{pos}:{pos + len(text)}]}}")
            else:
                return None  # a float, string, nested value: show formats the parsed one
            i += 1
            if tokens[i][1] == ",":
                i += 1
        extras = "f" + repr("[" + ",".join(items) + "]")
        i += 1
        if tokens[i][1] == ",":
            i += 1
    if tokens[i][1] != ")":
        return None
    names = "".join(f"n{k}, " for k in range(len(numbers)))
    row = (
        f"({_str_code(tokens[1])}, {_str_code(tokens[3])}, "
        f"f{' '.join(shapes)!r}, ({''.join(c + ', ' for c in dims_code)}), {extras})"
    )
    source = f"lambda t: (lambda {names}: {row})({', '.join(numbers)})"
    return eval(compile(source, "<row builder>", "eval"), {"__builtins__": {}, "int": int})  # type: ignore[no-any-return]


def _compile_shapes(sig: str) -> Callable[[str], str] | None:
    tokens = _tokenize(sig)
    i = 5  # past "(", op, ",", runner, ","
    if len(tokens) <= i or tokens[i][1] != "(":
        return None
    shapes: list[str] = []
    i += 1
    while tokens[i][1] == "(":
        dims, i = [], i + 1
        while tokens[i][0] == "num" and not any(c in tokens[i][1] for c in ".eE"):
            _, text, pos = tokens[i]
            dims.append(f"{{int(t[{pos}:{pos + len(text)}])}}")  # 007, -0: as str(int) prints
            i += 1
            if tokens[i][1] == ",":
                i += 1
        if tokens[i][1] != ")":
            return None
        shapes.append("x".join(dims) if dims else "()")
        i += 1
        if tokens[i][1] == ",":
            i += 1
    if tokens[i][1] != ")" or not shapes:
        return None  # a profile of other values: shapes() reads the parsed one
    source = "lambda t: f" + repr(" ".join(shapes))
    return eval(compile(source, "<shapes builder>", "eval"), {"__builtins__": {}, "int": int})  # type: ignore[no-any-return]


def _compile(sig: str) -> Callable[[str], CacheKey] | None:
    try:
        key = _checked_key(parse_value(sig))  # a key parses iff its signature does
    except KeyError_:
        return None
    tokens = _tokenize(sig)
    constants: list[object] = []
    code, _ = _items(tokens, 1, ")", constants)  # the key tuple's items: K's arguments
    scope = {
        "__builtins__": {},
        "int": int,
        "float": float,
        "tuple": tuple,
        "S": Symbol,
        "Z": TorchSize,
        "K": CacheKey,
        "C": constants,
    }
    source = f"lambda t: K({code}{'' if key.has_extras else 'None, '}{key.has_extras})"
    return eval(compile(source, "<key builder>", "eval"), scope)  # type: ignore[no-any-return]


def _leaf_code(
    tokens: list[tuple[str, str, int]], i: int, constants: list[object]
) -> tuple[str, int]:
    """Python source for the value starting at tokens[i] (a parsed signature's), and the index
    after it. A leaf without a 0 is the same in every key of the signature: a constant."""
    kind, text, pos = tokens[i]
    end = pos + len(text)
    if kind == "str":
        return (repr(_decode_string(text)) if "0" not in text else f"t[{pos + 1}:{end - 1}]"), i + 1
    if kind == "num":
        return f"{'float' if any(c in text for c in '.eE') else 'int'}(t[{pos}:{end}])", i + 1
    if kind == "name":
        if text in _KEYWORDS:
            return repr(_KEYWORDS[text]), i + 1
        if text == "torch.Size":
            dims, i = _leaf_code(tokens, i + 2, constants)  # past "(", the list, then ")"
            return f"Z(tuple({dims}))", i + 1
        if "0" in text:
            return f"S(t[{pos}:{end}])", i + 1
        constants.append(Symbol(text))  # one object for every key: frozen, never changed
        return f"C[{len(constants) - 1}]", i + 1
    close = ")" if text == "(" else "]"
    inner, i = _items(tokens, i + 1, close, constants)
    return (f"({inner})" if close == ")" else f"[{inner}]"), i


def _items(
    tokens: list[tuple[str, str, int]], i: int, close: str, constants: list[object]
) -> tuple[str, int]:
    """The items up to `close` as "a, b, " and the index after `close`."""
    items = []
    while tokens[i][1] != close:
        item, i = _leaf_code(tokens, i, constants)
        items.append(item)
        if tokens[i][1] == ",":
            i += 1
    return "".join(f"{item}, " for item in items), i + 1
