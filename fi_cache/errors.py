"""The one error type commands raise; the CLI turns it into one line and an exit code."""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

# Exit codes from ../shared/cli.md: 1 = a problem was found / operation failed, 2 = refused input.
EXIT_PROBLEM = 1
EXIT_REFUSED = 2


class FiCacheError(Exception):
    """A failure the user can act on: `path: message`, exit code `exit_code`."""

    exit_code = EXIT_PROBLEM

    def __init__(self, message: str, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = None if path is None else os.fspath(path)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class CorruptCache(FiCacheError):
    """A cache file that exists but cannot be read as FlashInfer would read it."""

    exit_code = EXIT_PROBLEM


class Refused(FiCacheError):
    """Input the tool will not work on: missing path, too large, bad usage."""

    exit_code = EXIT_REFUSED


def read_refusal(exc: OSError, path: str | os.PathLike[str], what: str) -> Refused:
    """A failed open/read of `path` (a `what`: "cache file", "log file") as one line."""
    if isinstance(exc, PermissionError):
        return Refused("permission denied", path)
    if isinstance(exc, IsADirectoryError):
        return Refused(f"is a directory, not a {what}", path)
    if isinstance(exc, FileNotFoundError):
        return Refused("no such file", path)
    return Refused(f"cannot read: {exc.strerror}", path)


_SPECIAL_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(mode: int) -> str | None:
    """What a file of `mode` is ("a FIFO", "a character device"...) when it is neither a regular
    file nor a directory (nor a link); None otherwise. Opening or reading one can wait forever
    (a FIFO nobody writes to, a terminal), so fi-cache reads only regular files."""
    return next((kind for test, kind in _SPECIAL_KINDS if test(mode)), None)


def special_message(kind: str, what: str) -> str:
    return f"is {kind}, not a {what} (reading it could wait forever)"


def refuse_special(path: str | os.PathLike[str], what: str) -> None:
    """Refused (exit 2) when `path` is a FIFO, device or socket (through symlinks), found
    without opening it; a missing or unreadable path is left to the caller's own read."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if (kind := special_kind(mode)) is not None:
        raise Refused(special_message(kind, what), path)


def open_regular(path: str | os.PathLike[str], what: str) -> BinaryIO:
    """`path` open for reading when it is a regular file (through links); Refused (exit 2)
    otherwise. Judged from its stat before the open, and from the open file after it: the open
    is O_NONBLOCK, so a FIFO or device swapped in between never makes it wait."""
    refuse_special(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise read_refusal(exc, path, what) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise Refused(f"is a directory, not a {what}", path)
        if not stat.S_ISREG(mode):
            raise Refused(special_message(special_kind(mode) or "no regular file", what), path)
        return os.fdopen(fd, "rb")  # O_NONBLOCK changes nothing for a regular file's reads
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str | os.PathLike[str], what: str, limit: int) -> bytes:
    """All of the regular file `path`, Refused (exit 2) when it holds more than `limit` bytes:
    at most limit + 1 are read, so a file that grows while read (or lies about its size, as
    /proc's do) costs no more."""
    with open_regular(path, what) as f:
        try:
            data = f.read(limit + 1)
        except OSError as exc:
            raise read_refusal(exc, path, what) from None
    if len(data) > limit:
        raise Refused(f"over {_size(limit)}: too large for a {what}", path)
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB" if n >= 1 << 10 else f"{n} bytes"
