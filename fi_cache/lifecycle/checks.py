"""doctor's pre-flight checks on a namespace, judged against the engine about to start on it
(serve refuses on their errors; seeding never takes a file they flag)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fi_cache.doctor.findings import Finding
from fi_cache.engines.api import Run, ServerEngine
from fi_cache.store.manifest import Manifest


def namespace_findings(
    engine: ServerEngine[Any, Any], run: Run[Any, Any], ns_dir: Path, m: Manifest | None
) -> list[Finding]:
    from fi_cache.doctor import preflight

    v = engine.checked_against(run)
    return preflight.check_namespace(
        run.ns, ns_dir, engine.autotune_dir(ns_dir), m, v.vllm, v.supports_finalize, v.sglang
    )
