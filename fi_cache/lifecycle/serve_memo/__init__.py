"""A repeated `fi-cache serve` hands over at once: the last serve with the same command line,
environment, working dir and credentials, whose every input is unchanged, is replayed (its
output, the engine's command and environment) without importing the rest of fi-cache.

record.py: the full serve is recorded from __main__ on, before anything else is imported: a
sys.audit hook notes every file opened and dir listed (fi-cache's and Python's modules
included), and os.stat/lstat/access are watched, so a decision on a stat alone (a model dir
there or not, a store that cannot be written, a link) reads an input too. A memo is kept only
of a serve that changed nothing it reads: no warm, no finding, no child process (nvidia-smi, a
probe), no write but the namespace's lock and in-use bookkeeping, and no input that changed
while it was read. Each input is stamped (stamps.py).

replay.py: the repeat re-stamps every input, falls back to the full serve at the first
difference, and looks in /proc for what no stamp shows (`vllm preload` daemons; SGLang's
servers). The memo names a command to exec, so it is private: <store>/.fi-cache/serve/<uid>/,
the dir 0700 and both the user's own, nothing in them writable by another.

FI_CACHE_SERVE_MEMO=0 runs the full serve every time; =explain says what the memo did. Light on
purpose: the standard library and fi_cache.store.in_use.
"""

from __future__ import annotations

import os
import sys

from fi_cache.lifecycle.serve_memo.stamps import blake2b, content

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

SCHEMA = 3
# "0": no memo is read or kept; "explain": a line on stderr says whether one was replayed, kept,
# or why not (what to look at when a repeated serve is not fast).
MEMO_ENV = "FI_CACHE_SERVE_MEMO"
STAT_EVENT = "fi_cache.stat"  # sys.audit event: a decision taken on this path's stat alone
EXPIRES_EVENT = "fi_cache.expires"  # sys.audit event: what was read holds until this time.time()
KEPT_MEMOS = 32  # per user and store: the newest, one per command line and environment
# marshal, not JSON: json's import (re, enum) is 8 ms of a repeat's ~20. The memo is trusted only
# as the user's own file (replay._read_private), as its command is.
MEMO_SUFFIX = ".marshal"
_STORE_ENV = "FI_CACHE_DIR"  # store/paths.STORE_ENV (a test holds them equal)
_OFF = ("0", "off", "false", "no")


def enabled(environ: Mapping[str, str]) -> bool:
    return environ.get(MEMO_ENV, "").strip().lower() not in _OFF


def explains(environ: Mapping[str, str]) -> bool:
    return environ.get(MEMO_ENV, "").strip().lower() == "explain"


def store_of(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """The store this command line names (--store, $FI_CACHE_DIR, the default), as the full serve
    would resolve it; the full serve keeps a memo only where the two agree."""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--store" and i + 1 < len(argv):
            return os.path.abspath(os.path.expanduser(argv[i + 1]))
        if arg.startswith("--store="):
            return os.path.abspath(os.path.expanduser(arg[len("--store=") :]))
    if env := environ.get(_STORE_ENV):
        return os.path.abspath(os.path.expanduser(env))
    import platformdirs

    return os.path.abspath(platformdirs.user_cache_dir("fi-cache", appauthor=False))


def memo_dir(store: str) -> str:
    return os.path.join(store, ".fi-cache", "serve", str(os.getuid()))


def key(argv: Sequence[str], environ: Mapping[str, str], cwd: str) -> str:
    """Everything a serve's decision may read that no file stamp shows."""
    from fi_cache import __version__

    parts = [
        SCHEMA,
        __version__,
        sys.executable,
        sys.version,
        list(sys.flags),  # -I, -E, -S: another sys.path, another fi_cache
        list(sys.warnoptions),
        cwd,
        list(argv),
        # Hashed only: the memo keeps no secret of the environment. `_` is the shell's note of
        # the last command (`time fi-cache serve` vs `fi-cache serve`): nothing reads it; nor
        # does the full serve read MEMO_ENV.
        sorted((k, v) for k, v in environ.items() if k not in ("_", MEMO_ENV)),
        # Who may read and write what: uids, gids, supplementary groups, capabilities.
        [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
        _capabilities(),
        content("/proc/sys/kernel/random/boot_id"),  # another boot, another machine
    ]
    text = repr(parts).encode(errors="surrogateescape")  # json's import costs a repeat 8 ms
    return blake2b(text, digest_size=16).hexdigest()


def _capabilities() -> list[str]:
    """This process's capability sets (root in a container may have dropped some)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            return [line.strip() for line in f if line.startswith("Cap")]
    except OSError:
        return []
