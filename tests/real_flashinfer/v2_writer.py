"""Write a v2 store with the real FlashInfer (0.7.x on sys.path), by the code path its
`autotune_v2(mode="tune")` takes: `_collect_metadata()` names the environment,
`_resolve_managed_store` opens `<root>/v2/<hash16>/`, `ManagedAutotuneCache.publish` writes each
winner. Only the tuning itself (a GPU's work) is skipped: the winners come from a v1 file.

    python -m tests.real_flashinfer.v2_writer ROOT SOURCE.json   ->  prints the env dir
"""

from __future__ import annotations

import json
import sys
from typing import Any


def open_store(root: str | None) -> Any:
    from flashinfer.autotune_cache import _resolve_managed_store
    from flashinfer.autotuner import AutoTuner, _collect_metadata

    return _resolve_managed_store(AutoTuner.get(), root, _collect_metadata())


def winners(source: str) -> dict[str, list[Any]]:
    with open(source, encoding="utf-8") as f:
        return {k: v for k, v in json.load(f).items() if k.startswith("(")}


def publish(store: Any, entries: dict[str, list[Any]]) -> None:
    for key, (runner, tactic, *_) in entries.items():
        store.publish(key, runner, tactic)


if __name__ == "__main__":
    store = open_store(sys.argv[1])
    publish(store, winners(sys.argv[2]))
    print(store.env_dir)
