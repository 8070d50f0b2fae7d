"""Checks over an SGLang target (`doctor --sglang-version V [-- SGLANG_ARGS]`): docs/sglang.md."""

from __future__ import annotations

from collections.abc import Iterator

from fi_cache.doctor import Check, Inputs
from fi_cache.doctor.findings import Finding
from fi_cache.engines.sglang.args import env_bool
from fi_cache.versions import (
    SGLANG_AUTOTUNE_CACHE_ENV,
    SGLANG_DETERMINISTIC_SKIPS_TUNE,
    SGLANG_FINALIZE_ENV,
    SGLANG_FINALIZE_FROM,
    SGLANG_NEWEST_CHECKED,
    SGLANG_RANK_DIGEST,
    parse_version,
)


def _version(inp: Inputs) -> str:
    return f"SGLang {inp.target.sglang_version}"


def ep_cache_discarded(inp: Inputs) -> Iterator[Finding]:
    """0.5.19+: TP ranks that disagree all delete their file; EP ranks never agree (#40320)."""
    v, args = parse_version(inp.target.sglang_version), inp.sglang
    if v not in SGLANG_RANK_DIGEST or args is None or args.ep <= 1 or args.tp <= 1:
        return
    if env_bool(inp.environ.get(SGLANG_AUTOTUNE_CACHE_ENV)) is False or args.autotune_disabled:
        return  # no cache read, nothing compared
    yield Finding(
        "sglang-ep-cache-discarded",
        "warning",
        None,
        f"{_version(inp)} with --ep-size {args.ep} and --tp-size {args.tp}: every TP rank hashes "
        "its cache file and environment and, when they differ, all delete their file; expert-"
        "parallel ranks tune different shapes, so the cache is discarded on every boot and "
        "autotune runs in full each time (sglang issue #40320, fix in PR #40420 unreleased)",
        "expect full tuning time at every start; a warm cannot help until SGLang fixes this",
    )


def finalize_not_read(inp: Inputs) -> Iterator[Finding]:
    """The variable set for a release that does not read it (before 0.5.18)."""
    v = parse_version(inp.target.sglang_version)
    if v is None or v >= SGLANG_FINALIZE_FROM or SGLANG_FINALIZE_ENV not in inp.environ:
        return
    yield Finding(
        "sglang-finalize-unsupported",
        "warning",
        None,
        f"{_version(inp)} does not read {SGLANG_FINALIZE_ENV} (it appears in 0.5.18): "
        "MoE runs FlashInfer's default finalize whatever it says",
        "upgrade to SGLang 0.5.18+ to choose the finalize mode",
    )


def nothing_tuned(inp: Inputs) -> Iterator[Finding]:
    v, args = parse_version(inp.target.sglang_version), inp.sglang
    if v is not None and v > SGLANG_NEWEST_CHECKED:
        yield Finding(
            "sglang-nothing-tuned",
            "info",
            None,
            f"{_version(inp)} is newer than the newest release checked, {SGLANG_NEWEST_CHECKED}: "
            "these checks follow that release",
            "-",
        )
    if args is None or v is None:
        return
    if args.deterministic and v >= SGLANG_DETERMINISTIC_SKIPS_TUNE:
        yield Finding(
            "sglang-nothing-tuned",
            "info",
            None,
            f"{_version(inp)} with --enable-deterministic-inference skips FlashInfer autotuning "
            "(and runs unfused finalize): no cache is read or written",
            "-",
        )


CHECKS = (
    Check(
        "sglang-ep-cache-discarded",
        "SGLang 0.5.19+, expert parallel with TP > 1: the cache is deleted every boot",
        ep_cache_discarded,
    ),
    Check(
        "sglang-finalize-unsupported",
        f"{SGLANG_FINALIZE_ENV} set for SGLang < 0.5.18, which ignores it",
        finalize_not_read,
    ),
    Check(
        "sglang-nothing-tuned",
        "SGLang 0.5.18+ deterministic inference tunes nothing (info)",
        nothing_tuned,
    ),
)
