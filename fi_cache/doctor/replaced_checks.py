"""A namespace file replaced after fi-cache's warm: what vLLM's preload daemon's D2D seeding
does. Its adopt installs a peer's table over an existing local file whenever the shared stores
gave nothing (seed.py 0.34:102-130), checking `_metadata` only, and writes it as
`json.dumps(table)`: one line (warmup_cache.py 0.34:216-219 through DiskArtifactStore.put,
artifact_store.py 0.34:70-83). FlashInfer saves indented (autotuner.py 0.7.4 save_configs:
`json.dump(ordered, f, indent=2)`), as fi-cache does (model/v1.dumps), and keeps a file's
entries when it saves over it. So, against the warm that recorded the file (its entries and
size; the manifest keeps no digest of it), two traces:

- the file is one line of JSON: written by the daemon's install (D2D, or its adopt from the
  shared tier), or by another tool that writes compact JSON;
- it holds fewer entries than the warm left, and no `fi-cache evict` took them: another writer
  replaced it, the daemon's D2D seeding being one.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import CacheView, Check, Inputs
from fi_cache.model import v1
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.versions import GENERATION_KEY

ID = "replaced-after-warm"


def _warm_of(m: Manifest, rel: str) -> tuple[WarmRecord, CacheFileRecord] | None:
    """The newest successful warm that recorded the file `rel`, with its record of it."""
    for w in reversed(m.warms):
        if w.ok and (rec := next((f for f in w.files if f.path == rel), None)) is not None:
            return w, rec
    return None


def _sizes(view: CacheView) -> tuple[int, int]:
    """The file's table as vLLM's install writes it (`json.dumps`: one line) and as FlashInfer
    saves it (`indent=2`), in bytes."""
    cf = view.cache.file
    table = json.loads(v1.dumps(cf, with_generation=False))
    if cf.generation is not None:
        table[GENERATION_KEY] = cf.generation  # as found: the peer's own
    return len(json.dumps(table).encode()), len(json.dumps(table, indent=2).encode())


def _replaced(inp: Inputs) -> Iterator[Finding]:
    for view in inp.caches:
        m, ns_dir, cache = view.manifest, view.namespace_dir, view.cache
        if m is None or ns_dir is None or cache.manifest is not None:  # v2: no file of its own
            continue
        try:
            rel = cache.path.relative_to(ns_dir).as_posix()
        except ValueError:
            continue
        found = _warm_of(m, rel)
        if found is None:
            continue
        warm, rec = found
        end, entries = warm.started + warm.seconds, len(cache.file.entries)
        if cache.modified <= end or (cache.size, entries) == (rec.size, rec.entries):
            continue  # the file the warm left
        evicted = any(e.at >= end for e, _ in m.evictions_of(rel))
        one_line, indented = _sizes(view)
        if (entries, indented) == (rec.entries, rec.size):
            continue  # the warm's table written again (an install of an equal peer's)
        if cache.size == one_line:
            trace = (
                "it is now one line of JSON, as vLLM's preload daemon writes a table it "
                "installs from a peer (D2D) or the shared tier; FlashInfer and fi-cache write "
                "it indented"
            )
        elif entries < rec.entries and not evicted:
            trace = (
                f"it holds {entries} entries where the warm left {rec.entries} and no evict "
                "took them (FlashInfer keeps a file's entries when it saves over it)"
            )
        else:
            continue
        yield _finding(view, rel, warm, rec, entries, trace)


def _finding(
    view: CacheView, rel: str, warm: WarmRecord, rec: CacheFileRecord, entries: int, trace: str
) -> Finding:
    argv = shlex.join(warm.argv)
    return Finding(
        ID,
        "warning",
        str(view.cache.path),
        f"replaced after fi-cache's warm (by the preload daemon's D2D seeding, or another "
        f"writer): {trace}. vLLM now loads that table, not the warm's: D2D checks its "
        "_metadata only, never its keys, tactic ids or finalize mode, and when every rank "
        "loads its file the sweep is skipped, so what the warm tuned and the table lacks "
        "stays untuned",
        f"move the file aside and run `fi-cache warm --again -- {argv}` (the warm's "
        "arguments) to tune this node's own; keep a daemon writing this namespace off D2D "
        "(no --seed-source-host) or give it a VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR of its own",
        {
            "warm_started": warm.started,
            "warm_entries": rec.entries,
            "entries": entries,
            "warm_size": rec.size,
            "size": view.cache.size,
            "relative": rel,
        },
    )


CHECKS = (
    Check(
        ID, "A namespace file replaced after fi-cache's warm (the preload daemon's D2D)", _replaced
    ),
)
