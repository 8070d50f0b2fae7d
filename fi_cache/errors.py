"""The one error type commands raise; the CLI turns it into one line and an exit code."""

from __future__ import annotations

import os
import stat

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
