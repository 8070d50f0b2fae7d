"""What `serve` does for every engine: pre-flight checks on the namespace, recording its use,
the JSON it prints, and handing the process to the engine (the command is serve.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click

from fi_cache.cli import render
from fi_cache.errors import FiCacheError, Refused


def _ctx() -> Any:
    return click.get_current_context().obj


def preflight_namespace(
    ns: Any,
    ns_dir: Path,
    cache_dir: Path,
    force: bool,
    vllm_version: str | None = None,
    supports_finalize: bool | None = None,
    sglang_version: str | None = None,
) -> Any:
    """The namespace's manifest, after doctor's pre-flight checks on its caches: errors stop the
    start unless --force; warnings are said."""
    from fi_cache.doctor import preflight
    from fi_cache.store import manifest as manifests

    try:
        m = manifests.load(ns_dir)
    except FiCacheError as exc:
        if not force:
            raise
        render.warn(f"{exc} (going on: --force)")
        m = None
    findings = preflight.check_namespace(
        ns, ns_dir, cache_dir, m, vllm_version, supports_finalize, sglang_version
    )
    errors = [f for f in findings if f.severity == "error"]
    for f in findings:
        say = render.error if f.severity == "error" else render.warn  # -q keeps the errors
        say(f"{f.severity} {f.check}: {f.path}: {f.message}\n    fix: {f.fix}")
    if errors and not force:
        raise FiCacheError(f"pre-flight found {len(errors)} error(s); fix them or pass --force")
    return m


def exec_engine(cmd: list[str], env: dict[str, str], name: str, doc: Any) -> NoReturn:
    """Hand this process to the engine: its signals reach it directly, its exit code is ours."""
    ctx = _ctx()
    if ctx.json and doc is not None:
        # One document on stdout, before the engine takes over: its log then goes to stderr (fd
        # 1 is pointed at fd 2), so `serve --format json | jq` reads only what fi-cache said.
        render.emit_json(doc)
        sys.stdout.flush()
        os.dup2(2, 1)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(cmd[0], cmd, env)
    except OSError as exc:
        raise Refused(f"cannot run {name}: {exc.strerror}", cmd[0]) from None


def serve_doc(
    ns_dir: Path, cache_dir: Path, finalize: str, warmed: Any, cmd: list[str]
) -> dict[str, Any]:
    """What `serve --format json` prints before it runs the engine."""
    warm = None
    if warmed is not None:
        warm = {
            "reused": warmed.reused,
            "seconds": warmed.record.seconds,
            "files": [
                {"path": str(warmed.namespace_dir / f.path), "entries": f.entries, "size": f.size}
                for f in warmed.files
            ],
        }
    return {
        "namespace": str(ns_dir),
        "finalize": finalize,
        "cache_dir": str(cache_dir),
        "warm": warm,  # null: the namespace was warm already (or --no-warm)
        "command": cmd,
    }


def touch(ns_dir: Path) -> None:
    """Record last use; a read-only or busy store just skips it."""
    from fi_cache.store import locks
    from fi_cache.store import manifest as manifests

    try:
        with locks.namespace_lock(ns_dir, "serve", timeout=2):
            m = manifests.load(ns_dir)
            if m is not None:
                manifests.save(ns_dir, m.used(time.time()))
    except (FiCacheError, OSError):
        pass
