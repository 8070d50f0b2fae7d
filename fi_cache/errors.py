"""The one error type commands raise; the CLI turns it into one line and an exit code."""

from __future__ import annotations

import os

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
