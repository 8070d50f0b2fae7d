"""What warm (and serve's warm) do just before vLLM starts: seed the file it will read from the
namespace's earlier files for the same model (maintenance/seed.py says why that is safe).

Which file vLLM will read comes from vLLM's own code (engines/vllm/predict.py), asked only when
there is something to seed; the sources are what earlier warms of the same model recorded,
less whatever doctor's pre-flight checks flag. Nothing here may stop a start: any failure is one
note on stderr, and vLLM then tunes as it would have.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fi_cache.errors import FiCacheError


def seeder(
    store: Path,
    ns: Any,
    env: Any,
    argv: Sequence[str],
    args: Any,
    note: Callable[[str], None],
) -> Callable[[Path, Any], dict[str, int]]:
    """The before-start hook for engines/vllm/warm.py (called under the namespace lock)."""

    def before_start(ns_dir: Path, manifest: Any) -> dict[str, int]:
        try:
            return _seed(store, ns, env, argv, args, ns_dir, manifest, note)
        except (FiCacheError, OSError) as exc:
            note(f"not seeding: {exc}")
            return {}

    return before_start


def _seed(
    store: Path,
    ns: Any,
    env: Any,
    argv: Sequence[str],
    args: Any,
    ns_dir: Path,
    manifest: Any,
    note: Callable[[str], None],
) -> dict[str, int]:
    from fi_cache.doctor import preflight
    from fi_cache.engines.vllm import launch
    from fi_cache.engines.vllm.args import parse_serve_args
    from fi_cache.engines.vllm.engine import ENGINE
    from fi_cache.engines.vllm.predict import predict
    from fi_cache.errors import Refused
    from fi_cache.maintenance import seed
    from fi_cache.store.paths import state_dir

    def same_model(other: Sequence[str]) -> bool:
        try:
            return bool(parse_serve_args(other).model == args.model)
        except Refused:
            return False

    warms = manifest.warms if manifest else ()
    earlier = [w for w in warms if w.engine == "vllm" and w.files and same_model(w.argv)]
    if not earlier or args.model is None:
        return {}  # nothing to carry: vLLM's prediction is not worth its seconds
    if env.vllm.version is None:
        note("not seeding: no vLLM found to ask which file it will read")
        return {}
    root = ENGINE.cache_dir(ns_dir)
    launch_env = launch.launch_env(
        dict(os.environ), root, ns.finalize, args.uses_ray, env.vllm.supports_finalize_env
    )
    where = predict(env.python, env.vllm.version, list(argv), launch_env, state_dir(store))
    if where.store == "v2":
        note("nothing to seed: vLLM keeps FlashInfer's v2 store here (no per-config file)")
        return {}
    findings = preflight.check_namespace(
        ns, ns_dir, root, manifest, env.vllm.version, env.vllm.supports_finalize_env
    )
    flagged = [Path(f.path) for f in findings if f.path and f.severity != "info"]
    seeds, notes = seed.plan(ns_dir, manifest, same_model, where.paths, flagged)
    for line in notes:
        note(line)
    done: dict[str, int] = {}
    for s in seeds:
        seed.write(s)
        done[str(s.target.relative_to(ns_dir))] = s.entries
        note(f"seeded {s.entries} entries from {len(s.sources)} earlier file(s): {s.target}")
    return done
