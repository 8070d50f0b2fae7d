"""Facts from vLLM / FlashInfer logs: which autotune cache was loaded, saved or ignored (and why),
how long tuning took, and whether start-up died with `Invalid gemm1/gemm2 profile id`.

Message strings per FlashInfer version: docs/research/flashinfer-cache-format.md, section d.
Everything here is pure except `read_log`, which streams one file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO, Literal

from fi_cache.engines.vllm import logs as vllm_logs
from fi_cache.errors import Refused, read_refusal, refuse_special

EventKind = Literal["loaded", "saved", "ignored", "skipped-cudnn"]


@dataclass(frozen=True)
class CacheEvent:
    """One FlashInfer autotuner message about a cache file."""

    kind: EventKind
    path: str | None  # the cache file named in the line (None for skipped-cudnn)
    line_no: int  # 1-based
    count: int | None = None  # configs loaded/saved/skipped
    hard: bool | None = None  # "ignored": True = different environment, False = indeterminate
    mismatches: tuple[tuple[str, str, str], ...] = ()  # (field, saved, current) for "ignored"


@dataclass(frozen=True)
class ProfileIdError:
    """A start-up crash on a tuned MoE tactic id outside the kernel's gemm1/gemm2 range."""

    gemm: int  # 1 or 2
    tactic_id: int
    line_no: int
    last_loaded: str | None  # the cache file most recently "Loaded ... from" before this line
    process: str = ""  # vLLM's `pid=N` prefix of the line ("" when it has none)
    # At vLLM's ERROR level: its logger's copy of the exception (the traceback's follows).
    logged: bool = field(default=False, compare=False)


@dataclass(frozen=True)
class Fallback:
    """FlashInfer found no tuned entry for a call and ran its fallback tactic (-1)."""

    op: str
    tactic: int
    line_no: int
    shapes: str | None = None  # the call's input shapes as the line prints them


@dataclass(frozen=True)
class RootCause:
    """The first exception a failed start's log holds: vLLM's last line says only "See root
    cause above" (v1/engine/utils.py 0.32:1426-1434), over a hundred lines after it."""

    text: str  # "ValueError: Available memory on node 0 ..."
    line_no: int
    process: str = ""  # vLLM's `(Worker pid=N)` prefix ("" when it has none)


@dataclass(frozen=True)
class LogFacts:
    """What one log says about autotune caches."""

    path: str
    events: tuple[CacheEvent, ...]
    errors: tuple[ProfileIdError, ...]
    tuning_seconds: tuple[float, ...]  # one per timestamped "process starts" .. "ends" pair
    lines: int
    fallbacks: tuple[Fallback, ...] = ()
    from_tools: bool = False  # any line from vLLM or FlashInfer at all (else: the wrong file?)
    root_cause: RootCause | None = None  # only where the log says the start failed


# Every interesting line contains one of these; regexes run only on lines that do.
_NEEDLES = (
    "utotune",
    "profile id",
    "cuDNN",
    "No tuned config",
    "Error: ",
    "Exception: ",
    "root cause above",
)
_BYTE_NEEDLES = tuple(needle.encode() for needle in _NEEDLES)
_BREAKS = re.compile(r"[\r\n]")

# A line vLLM, SGLang or FlashInfer printed, not one that names them (a README does): vLLM's
# level + date prefix, SGLang's "[date time", the autotuner's tag, FlashInfer's JIT logger
# (jit/core.py 0.7.4:69-72), a traceback frame in one of their packages.
_TOOL_LINE = re.compile(
    rb"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d|"
    rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d|\[Auto[Tt]uner\]| - flashinfer\.\w+: |"
    rb"[/\\](?:vllm|sglang|flashinfer)[/\\][^\"\n]*\.py\", line \d+"
)

# FlashInfer writes "[Autotuner]" in these messages and "[AutoTuner]" elsewhere; accept both.
_TAG = r"\[Auto[Tt]uner\]: "
# Messages with a free-text middle are matched as head, then tail searched once from the head:
# a regex `HEAD(.*)TAIL` retried at each of n heads on a line costs n x its length (issue 25).
# "Saved N configs to PATH (A new, B from previous config)": PATH runs to the last such tail.
_SAVED = re.compile(_TAG + r"Saved (\d+) configs to ")
_SAVED_TAIL = re.compile(r" \(\d+ new, \d+ from previous config\)")
_LOADED = re.compile(_TAG + r"Loaded (\d+) configs from (.*\S)")
# "Cache file PATH was created in a different environment (WHY). Ignoring cached configs.MORE"
_IGNORED = re.compile(_TAG + r"Cache file ")
_IGNORED_MIDDLE = " was created in a different environment ("
_IGNORED_TAIL = "). Ignoring cached configs."
_SKIPPED = re.compile(_TAG + r"Skipped (\d+) legacy cuDNN config")
_TUNING = re.compile(_TAG + r"Autotuning process (starts|ends)")
# FlashInfer 0.6.18: "No tuned config covers OP input_shapes=...; falling back to ... tactic=-1"
_FALLBACK = re.compile(r"No tuned config covers (\S+)")
_FALLBACK_SHAPES = " input_shapes="
_FALLBACK_TAIL = re.compile(r"falling back to runner=\S+ tactic=(-?\d+)")
PROFILE_ID = re.compile(r"Invalid gemm([12]) profile id: (-?\d+)")
# An exception as Python prints it, at the start of the message: bare (a traceback's last
# line) or after vLLM's prefix at level ERROR or CRITICAL (a WARNING that quotes one is not).
# Its dotted name is bounded: re keeps a frame per repeat of a group (a 10 MB "a.a.a…" took 0.9 GB).
_EXCEPTION = re.compile(
    r"^(\([^)]*pid=\d+\) )?(?:(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d\S* \[[^\]]*\] )?"
    r"((?:[A-Za-z_]\w{0,200}\.){0,32}[A-Za-z_]\w{0,200}(?:Error|Exception): \S.*)$"
)
_LOGGED = re.compile(r"(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d")
# vLLM's API server, after an engine core or worker died: the cause is earlier in the log.
_FAILED_START = "See root cause above"
# A pair starts with ", field: saved=" so values may hold spaces, commas and colons.
_PAIR_START = re.compile(r"(?:^|, )([A-Za-z_]\w*): saved=")
# FlashInfer: "2026-11-30 01:30:10,474"; vLLM: "INFO 11-30 02:00:00" (no year).
_STAMP = re.compile(r"(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:,(\d{3}))?|" + vllm_logs.STAMP)
_PID = vllm_logs.PROCESS
# FlashInfer formats a missing saved value as "None" or "unknown": those mismatches are soft.
_INDETERMINATE = ("None", "unknown")
# Year for year-less vLLM stamps: a leap year, so "02-29" parses.
_LEAP_YEAR = 2000

_HEAD_BYTES = 64 * 1024
_CHUNK_BYTES = 1 << 20
# Share of undecodable characters above which the head is not text (random bytes give ~0.43).
_BINARY_RATIO = 0.3


@dataclass(frozen=True)
class _Stamp:
    when: datetime
    has_year: bool


def _interesting(text: str) -> bool:
    return any(needle in text for needle in _NEEDLES)


def _stamp(prefix: str) -> _Stamp | None:
    """The last timestamp in the text before a message, if any."""
    found = _STAMP.findall(prefix)
    if not found:
        return None
    year, *full, milli, month, day, hour, minute, second = found[-1]
    if year:
        month, day, hour, minute, second = full
    try:
        when = datetime(
            int(year or _LEAP_YEAR), int(month), int(day), int(hour), int(minute), int(second)
        )
    except ValueError:
        return None
    return _Stamp(when + timedelta(milliseconds=int(milli or 0)), bool(year))


def _seconds(start: _Stamp, end: _Stamp) -> float | None:
    """Seconds from start to end; None when the clock went backwards."""
    a, b = start.when, end.when
    dated = start.has_year and end.has_year
    if not dated:
        # Without a year on one side, compare both within the same leap year.
        a, b = a.replace(year=_LEAP_YEAR), b.replace(year=_LEAP_YEAR)
    delta = b - a
    if delta < timedelta(0) and not dated:
        # A year-less end before its start crossed New Year (Dec -> Jan skips no leap day).
        delta += timedelta(days=366)
    return delta.total_seconds() if delta >= timedelta(0) else None


def _mismatches(text: str) -> tuple[tuple[str, str, str], ...]:
    """Split FlashInfer's `field: saved=X vs current=Y, ...` into (field, X, Y) triples."""
    starts = list(_PAIR_START.finditer(text))
    pairs: list[tuple[str, str, str]] = []
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        saved, sep, current = text[match.end() : end].partition(" vs current=")
        if sep:
            pairs.append((match.group(1), saved, current))
    return tuple(pairs)


def _is_hard(consequence: str, pairs: tuple[tuple[str, str, str], ...]) -> bool | None:
    """True when FlashInfer will never overwrite the file, False when the next save replaces it."""
    if "will not be saved" in consequence:
        return True
    if "indeterminate" in consequence:
        return False
    # Cut-off line: FlashInfer calls a mismatch soft only when the saved value is indeterminate.
    if pairs:
        return any(saved not in _INDETERMINATE for _, saved, _ in pairs)
    return None


def _ignored(text: str, line_no: int) -> CacheEvent | None:
    # As `Cache file (.+?) MIDDLE(.*)TAIL(.*)`: a later head only finds a later middle.
    if (head := _IGNORED.search(text)) is None:
        return None
    middle = text.find(_IGNORED_MIDDLE, head.end() + 1)
    tail = text.rfind(_IGNORED_TAIL)
    if middle < 0 or tail < middle + len(_IGNORED_MIDDLE):
        return None
    pairs = _mismatches(text[middle + len(_IGNORED_MIDDLE) : tail])
    hard = _is_hard(text[tail + len(_IGNORED_TAIL) :], pairs)
    path = text[head.end() : middle]
    return CacheEvent("ignored", path, line_no, hard=hard, mismatches=pairs)


def _saved(text: str, line_no: int) -> CacheEvent | None:
    if (head := _SAVED.search(text)) is None:
        return None
    # The last tail, as the greedy `(.*)` before it took.
    last = deque(_SAVED_TAIL.finditer(text, head.end()), maxlen=1)
    if not last:
        return None
    path = text[head.end() : last[0].start()]
    return CacheEvent("saved", path, line_no, count=int(head.group(1)))


def _fallback(text: str, line_no: int) -> Fallback | None:
    """As `covers (\\S+)(?: input_shapes=(.*?);)?.*?TAIL`, each search made once."""
    if (head := _FALLBACK.search(text)) is None:
        return None
    op_start, op_end = head.span(1)
    shapes, tail = None, None
    at = op_end + len(_FALLBACK_SHAPES)
    semi = text.find(";", at) if text.startswith(_FALLBACK_SHAPES, op_end) else -1
    if semi >= 0 and (tail := _FALLBACK_TAIL.search(text, semi + 1)):
        shapes = text[at:semi]
    tail = tail or _FALLBACK_TAIL.search(text, op_end)
    if tail is None and op_end - op_start > len("falling"):
        # "covers OPfalling back ...": the tail starts inside the op's word
        op_end -= len("falling")
        tail = _FALLBACK_TAIL.match(text, op_end)
    if tail is None:
        return None
    return Fallback(text[op_start:op_end], int(tail.group(1)), line_no, shapes)


def _event(text: str, line_no: int) -> CacheEvent | None:
    """The cache event one line segment reports, if any."""
    if event := _saved(text, line_no):
        return event
    if match := _LOADED.search(text):
        return CacheEvent("loaded", match.group(2), line_no, count=int(match.group(1)))
    if match := _SKIPPED.search(text):
        return CacheEvent("skipped-cudnn", None, line_no, count=int(match.group(1)))
    return _ignored(text, line_no)


@dataclass
class _Parser:
    """Accumulates facts from the interesting lines of one log, in order."""

    events: list[CacheEvent] = field(default_factory=list)
    errors: list[ProfileIdError] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    tuning: list[float] = field(default_factory=list)
    # Open "process starts" stamps per process (vLLM's `pid=N` prefix), newest last.
    starts: dict[str, list[_Stamp | None]] = field(default_factory=dict)
    # Each process's newest gemm error: a scan of `errors` per line was quadratic (F13).
    last_error: dict[str, ProfileIdError] = field(default_factory=dict)
    last_loaded: str | None = None
    from_tools: bool = False
    first_exception: RootCause | None = None
    failed_start: bool = False

    def feed(self, line_no: int, line: str) -> None:
        # tqdm redraws with "\r": each piece is its own message (and none holds a "\n").
        for segment in _BREAKS.split(line):
            if _interesting(segment):
                try:
                    self._segment(line_no, segment)
                except (ValueError, OverflowError):
                    continue  # a number no real log line holds (4300+ digits): not our line

    def facts(self, path: str, lines: int) -> LogFacts:
        return LogFacts(
            path,
            tuple(self.events),
            tuple(self.errors),
            tuple(self.tuning),
            lines,
            tuple(self.fallbacks),
            self.from_tools,
            self.first_exception if self.failed_start else None,
        )

    def _segment(self, line_no: int, text: str) -> None:
        if _FAILED_START in text:
            self.failed_start = True
        elif self.first_exception is None and (exc := _EXCEPTION.match(text)):
            pid = _PID.search(exc.group(1) or "")
            cause = exc.group(2).strip()[:400]
            self.first_exception = RootCause(cause, line_no, pid.group(1) if pid else "")
        if match := PROFILE_ID.search(text):
            gemm, tactic = int(match.group(1)), int(match.group(2))
            pid = _PID.search(text[: match.start()])
            process = pid.group(1) if pid else ""
            logged = _LOGGED.search(text[: match.start()]) is not None
            last = self.last_error.get(process)
            again = last is not None and (last.gemm, last.tactic_id) == (gemm, tactic)
            if again and not logged and last is not None and last.logged:
                return  # vLLM's EngineCore prints the exception its logger just logged: one crash
            error = ProfileIdError(gemm, tactic, line_no, self.last_loaded, process, logged)
            self.errors.append(error)
            self.last_error[process] = error
        elif fallback := _fallback(text, line_no):
            self.fallbacks.append(fallback)
        elif match := _TUNING.search(text):
            self._tuning(text[: match.start()], match.group(1) == "starts")
        elif event := _event(text, line_no):
            self.events.append(event)
            if event.kind == "loaded":
                self.last_loaded = event.path

    def _tuning(self, prefix: str, starts: bool) -> None:
        pid = _PID.search(prefix)
        open_starts = self.starts.setdefault(pid.group(1) if pid else "", [])
        stamp = _stamp(prefix)
        if starts:
            open_starts.append(stamp)
            return
        # Pair with the newest open start: a start left open by a crashed run stays unpaired.
        start = open_starts.pop() if open_starts else None
        seconds = _seconds(start, stamp) if start and stamp else None
        if seconds is not None:
            self.tuning.append(seconds)


def parse_log(lines: Iterable[str], path: str = "<log>") -> LogFacts:
    """Facts from log lines (one item per line; a "\\r" inside an item does not end it)."""
    parser = _Parser()
    count = 0
    for count, line in enumerate(lines, 1):
        if not parser.from_tools:
            parser.from_tools = _TOOL_LINE.search(line.encode("utf-8", "replace")) is not None
        if _interesting(line):
            parser.feed(count, line)
    return parser.facts(path, count)


def read_log(path: Path) -> LogFacts:
    """Read and parse a log file, streaming it; a pipe or FIFO only while something writes to it.

    Raises Refused (exit 2) for a missing, unreadable or binary file, a directory, a device or
    socket, and a FIFO with no writer (opening that one would wait forever).
    """
    try:
        if stat.S_ISFIFO(path.stat().st_mode):
            return _read_pipe(path)
        refuse_special(path, "log file")
        with path.open("rb") as stream:
            return _read_stream(stream, path)
    except OSError as exc:
        raise read_refusal(exc, path, "log file") from None


def _read_pipe(path: Path) -> LogFacts:
    """`--log <(kubectl logs POD)`, `--log /dev/stdin`: read while a writer holds the pipe.
    A non-blocking open never waits; its first read tells a writer (data, or EAGAIN: none yet)
    from none (EOF), where a blocking open or read would hang."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb", buffering=0) as stream:
        try:
            first = os.read(fd, _HEAD_BYTES)
        except BlockingIOError:
            first = None  # a writer is there, nothing written yet
        if first == b"":
            raise Refused(
                "is a FIFO nothing is writing to (give a file, or start the writer first)", path
            )
        os.set_blocking(fd, True)
        return _read_stream(stream, path, first or b"")


def looks_like_log(path: Path) -> bool:
    """Is this file text that is not JSON (a log given where a cache was expected)?"""
    try:
        with path.open("rb") as stream:
            head = stream.read(_HEAD_BYTES)
    except OSError:
        return False
    start = head.lstrip()[:1]
    if not start or start in b"{[" or _binary_reason(head) is not None:
        return False
    try:  # a JSON string, number or null is a (corrupt) cache, not a log
        json.loads(head)
    except ValueError:
        return True
    return False


def _read_stream(stream: BinaryIO, path: Path, start: bytes = b"") -> LogFacts:
    # Read the head first and keep it, so pipes (`--log <(kubectl logs ...)`) work too.
    head = start + _read_upto(stream, _HEAD_BYTES - len(start))
    reason = _binary_reason(head)
    if reason:
        raise Refused(reason, path)
    parser = _Parser()
    lines = _feed_chunks(parser, _chunks(head, stream))
    return parser.facts(str(path), lines)


def _read_upto(stream: BinaryIO, size: int) -> bytes:
    """Up to `size` bytes, fewer only at the end (a pipe's read returns what it has so far)."""
    parts: list[bytes] = []
    while size > 0 and (block := stream.read(size)):
        parts.append(block)
        size -= len(block)
    return b"".join(parts)


def _binary_reason(head: bytes) -> str | None:
    """Why the first bytes of a file are not a text log, or None when they are."""
    if b"\0" in head:
        return "binary file (NUL bytes), not a text log"
    text = head.decode("utf-8", errors="replace")
    # Real U+FFFD characters in the file are text, not decoding failures.
    bad = text.count("\ufffd") - head.count("\ufffd".encode())
    if text and bad > _BINARY_RATIO * len(text):
        return "binary file (not UTF-8 text), not a text log"
    return None


def _chunks(head: bytes, stream: BinaryIO) -> Iterator[bytes]:
    yield head
    yield from iter(lambda: stream.read(_CHUNK_BYTES), b"")


def _feed_chunks(parser: _Parser, chunks: Iterable[bytes]) -> int:
    """Feed the complete lines of a byte stream to parser; return how many lines it has."""
    lines = 0
    pending: list[bytes] = []  # the unfinished last line, maybe over several chunks
    for chunk in chunks:
        cut = chunk.rfind(b"\n") + 1
        if not cut:
            pending.append(chunk)
            continue
        lines = _feed_block(parser, b"".join([*pending, chunk[:cut]]), lines)
        pending = [chunk[cut:]]
    tail = b"".join(pending)
    return _feed_block(parser, tail + b"\n", lines) if tail else lines


def _feed_block(parser: _Parser, block: bytes, before: int) -> int:
    """Feed the lines of block (whole lines, "\\n"-terminated) that hold a needle.

    `before` lines precede block; returns the line count after it. Only "\\n" ends a line, so
    line numbers match an editor's even with tqdm's "\\r" redraws.
    """
    line_no, counted_to = before, 0
    if not parser.from_tools:
        parser.from_tools = _TOOL_LINE.search(block) is not None
    for start in _hit_lines(block):
        line_no += block.count(b"\n", counted_to, start)
        counted_to = start
        end = block.index(b"\n", start)
        parser.feed(line_no + 1, block[start:end].decode("utf-8", errors="replace"))
    return before + block.count(b"\n")


def _hit_lines(block: bytes) -> list[int]:
    """Start offsets of the lines in block that contain a needle, in file order."""
    starts: set[int] = set()
    for needle in _BYTE_NEEDLES:
        at = block.find(needle)
        while at >= 0:
            starts.add(block.rfind(b"\n", 0, at) + 1)
            at = block.find(needle, block.index(b"\n", at))
    return sorted(starts)
