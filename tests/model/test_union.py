"""model/union.py: the union of many tables that agree costs a look per key, not per pair of
holders (align on an aligned 64-rank deployment compared each key's 64 values pairwise)."""

from __future__ import annotations

from fi_cache.model import v1
from fi_cache.model.union import merge
from tests.growth import lines_run

META = {"flashinfer_version": "0.6.18", "gpu": "NVIDIA H200"}
KEY = "('bf16_gemm', 'R', (({m}, 4096), (4096, 2048)), ())"


def _ranks(n: int, keys: int = 50) -> list[tuple[str, v1.CacheFile]]:
    entries = {KEY.format(m=m): ["R", m % 5] for m in range(keys)}
    return [(f"rank{r}", v1.CacheFile(META, dict(entries))) for r in range(n)]


def test_agreeing_holders_make_no_conflict_and_no_pairwise_work() -> None:
    result = merge(_ranks(32))
    assert len(result.file.entries) == 50 and result.conflicts == []
    # Per key, every further holder that agrees adds a constant, not a compare with each seen.
    per_holder = (lines_run(lambda: merge(_ranks(32))) - lines_run(lambda: merge(_ranks(16)))) / 16
    assert per_holder < 50 * 6, per_holder  # 10.5 lines per key and holder before, 4.5 now


def test_a_holder_that_disagrees_is_still_a_conflict() -> None:
    files = _ranks(8)
    odd = dict(files[5][1].entries)
    odd[KEY.format(m=3)] = ["R", 4]
    files[5] = ("rank5", v1.CacheFile(META, odd))
    [conflict] = merge(files).conflicts
    assert (conflict.kept, conflict.dropped, conflict.dropped_from) == (["R", 3], ["R", 4], "rank5")
