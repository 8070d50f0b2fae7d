"""Checks over cache files: integrity, environment, the gemm2 collision, permissions, leftovers."""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from fi_cache.caches.discover import STAGING_PREFIX, TMP_MAX_AGE_S
from fi_cache.doctor.findings import Finding
from fi_cache.doctor.inputs import Check, Inputs
from fi_cache.doctor.vllm_checks import runs_finalize, selects_unfused
from fi_cache.engines.vllm.launch import ALTERNATIVES
from fi_cache.model import v1
from fi_cache.model.fingerprint import compare_metadata
from fi_cache.model.moe import gemm_stage, split_gemm2
from fi_cache.versions import (
    FLASHINFER_FINALIZE_IN_KEY,
    SGLANG_FINALIZE_FROM,
    VLLM_FINALIZE_ENV,
    VLLM_NEWEST_CHECKED,
    moe_tactic_lists,
    parse_version,
    sm_of_gpu,
)


def _problems(inp: Inputs, check: str, fix: Callable[[str], str]) -> Iterator[Finding]:
    """Errors for the files the scan could not read, under the check that names why."""
    for p in inp.problems:
        if p.check == check:
            yield Finding(check, "error", str(p.path), p.message, fix(str(p.path)))


def _quarantine_text(inp: Inputs, path: str, other: str) -> str:
    """fix.py's way to move `path` aside: loaded only once a finding needs it (serve's pre-flight
    on a healthy namespace writes no fix)."""
    from fi_cache.doctor.fix import quarantine_text

    return quarantine_text(inp, path, other)


def _move_aside(inp: Inputs, path: str) -> str:
    how = _quarantine_text(inp, path, "")
    if how:
        return f"move it aside ({how}) and let vLLM re-tune (or warm again)"
    if path in {str(v.cache.path) for v in inp.caches if v.cache.found.format == "v2"}:
        return "delete the entry file; FlashInfer re-tunes that shape (--fix leaves v2 stores be)"
    return (
        "move it aside by hand and let vLLM re-tune (--fix moves only files where a cache "
        "belongs: vLLM's file names, the store)"
    )


def corrupt_file(inp: Inputs) -> Iterator[Finding]:
    yield from _problems(inp, "corrupt-file", lambda path: _move_aside(inp, path))
    for view in inp.caches:
        for d in view.defects:
            if d.check == "corrupt-file":
                path = str(view.cache.path)
                yield Finding("corrupt-file", "error", path, d.message, _move_aside(inp, path))


def generation_mismatch(inp: Inputs) -> Iterator[Finding]:
    for view in inp.caches:
        for d in view.defects:
            if d.check == "generation-mismatch":
                yield Finding(
                    "generation-mismatch",
                    "warning",
                    str(view.cache.path),
                    d.message,
                    "FlashInfer does not check it on load; the file was edited after FlashInfer "
                    "wrote it: delete it to have it re-tuned, or restore the original",
                )


def foreign_environment(inp: Inputs) -> Iterator[Finding]:
    for view in inp.caches:
        if not view.applies:
            continue
        cache = view.cache
        mismatches = compare_metadata(cache.metadata, inp.target.fingerprint)
        if not mismatches:
            continue
        fields = "; ".join(f"{m.field}: saved {m.saved!r}, target {m.target!r}" for m in mismatches)
        if any(m.hard for m in mismatches):
            how = _quarantine_text(inp, str(cache.path), "or move the file aside")
            yield Finding(
                "foreign-environment",
                "error",
                str(cache.path),
                f"written in another environment ({fields}): FlashInfer ignores it and never "
                "overwrites it, so every start re-tunes",
                f"give this environment its own cache dir (fi-cache serve does); {how}",
            )
        else:
            yield Finding(
                "foreign-environment",
                "warning",
                str(cache.path),
                f"its recorded environment is indeterminate ({fields}): FlashInfer ignores it "
                "and replaces it at the next save",
                "nothing to do: the next tuned start heals it",
            )


def _gemm2_tactics(cf: v1.CacheFile) -> list[int]:
    """GEMM2 tactic ids of MoE entries whose keys record no finalize mode."""
    out = []
    for raw, value in cf.entries.items():
        if "gemm2" not in raw:
            continue
        entry = v1.moe_entry(raw)
        if entry is None or entry[1] != "unknown" or gemm_stage(entry[0]) != 2:
            continue
        tactic = value[1] if isinstance(value, list) and len(value) > 1 else None
        if isinstance(tactic, int) and not isinstance(tactic, bool):
            out.append(tactic)
    return out


def _writers(view: Any) -> tuple[Any, ...]:
    """The recorded warms that wrote this file: none for a file no warm lists (copied in by
    hand: nothing vouches for its mode); all warms when no warm lists any file at all."""
    warms = view.manifest.warms if view.manifest else ()
    if view.namespace_dir is None or not any(w.files for w in warms):
        return tuple(warms)
    try:
        rel = str(view.cache.path.relative_to(view.namespace_dir))
    except ValueError:
        return tuple(warms)
    return tuple(w for w in warms if any(f.path == rel for f in w.files))


@dataclass(frozen=True)
class _Tuned:
    """How a file's <= 0.6.17 GEMM2 entries were tuned, as far as the store can say."""

    mode: str
    why: str  # what says so, for a reader who has never heard of finalize modes
    ignored_by_warm: bool = False  # a `warm --finalize unfused` whose vLLM tuned fused anyway
    guessed: bool = False  # nothing records the mode: "fused" is the likely answer, not a fact


def _tuned_mode(view: Any) -> _Tuned:
    """Every vLLM release tunes fused; only an unfused namespace whose warms of this file all
    passed the mode on is unfused: a vLLM that reads the variable, or FlashInfer itself (`warm
    --engine flashinfer`)."""
    warms = _writers(view)
    none_reads = f"every vLLM release up to {VLLM_NEWEST_CHECKED} tunes fused"
    if view.namespace_finalize == "unfused":
        ignored = [w for w in warms if w.supports_finalize_env is False]
        if ignored:
            return _Tuned(
                "fused",
                f"the warm that wrote them ran vLLM {ignored[-1].vllm_version}, which does not "
                f"read {VLLM_FINALIZE_ENV}: it tuned fused kernels into this unfused namespace",
                True,
            )
        if warms and all(w.supports_finalize_env for w in warms):
            return _Tuned("unfused", "by warms that passed the mode on (the namespace records it)")
        if warms:
            return _Tuned(
                "fused",
                "most likely: this unfused namespace was warmed by a vLLM fi-cache could not "
                f"inspect, and {none_reads}",
                True,
                True,
            )
        return _Tuned(
            "fused",
            f"most likely: no warm of this unfused namespace is recorded, and {none_reads}",
            guessed=True,
        )
    if view.namespace_finalize == "fused":
        return _Tuned("fused", "this is the store's fused namespace")
    return _Tuned(
        "fused",
        f"most likely: nothing records how this file was tuned, and {none_reads}",
        guessed=True,
    )


def _counts(view: Any) -> tuple[int, dict[str, int]] | None:
    """(g1, {mode: g2}) recorded in the namespace manifest by a FlashInfer-driven warm."""
    data: Any = view.manifest.unknown.get("tactic_counts") if view.manifest else None
    try:
        return int(data["gemm1"]), {k: int(v) for k, v in data["gemm2"].items()}
    except (TypeError, KeyError, ValueError, AttributeError, OverflowError):
        return None  # not what a warm records (edited by hand?): as if there were none


def _sm(arch: str | None) -> int | None:
    """vLLM's arch dir name ("90a", "100a", "120f") -> the SM number."""
    digits = "".join(ch for ch in arch or "" if ch.isdigit())
    return int(digits) if digits and "_" not in (arch or "") else None


def _measured_split(
    view: Any,
    inp: Inputs,
    tactics: list[int],
    tuned: str,
    counts: tuple[int, dict[str, int]] | None,
    runs: str,
) -> tuple[str, dict[str, Any]] | None:
    """The exact split from tactic lists measured for this FlashInfer, SM and dtype, when there
    are such lists and the namespace's recorded counts (if any) agree with them: counts a warm
    read from this machine's own runner win over a table. <= 0.6.17 keys hold no dtype: the only
    measured one, bf16, is assumed."""
    target = inp.target
    version = view.cache.flashinfer_version or target.fingerprint.flashinfer_version
    sm = _sm(target.fingerprint.arch or view.cache.found.arch) or sm_of_gpu(
        target.fingerprint.gpu or view.cache.fingerprint.gpu
    )
    lists = moe_tactic_lists(version, sm, "bf16")
    if lists is None or tuned not in lists.gemm2 or runs not in lists.gemm2:
        return None
    measured = {m: lists.gemm2_count(m) for m in lists.gemm2}
    if counts is not None and (
        counts[0] != lists.gemm1 or any(counts[1].get(m, n) != n for m, n in measured.items())
    ):
        return None  # this runner's lists are not the measured ones
    s = split_gemm2(tactics, lists.gemm1, lists.gemm2[tuned], lists.gemm2[runs])
    details = {
        "crash_ids": list(s.crash),
        "other_kernel_ids": list(s.other_kernel),
        "same_kernel_ids": list(s.same_kernel),
        "tactic_counts": {"gemm1": lists.gemm1, "gemm2": measured},
        "assumed": f"bf16 on SM{lists.sm} (keys before 0.6.18 hold no dtype)",
        "source": lists.source,
    }
    text = (
        f": ids {_ids(s.crash)} crash start-up with `Invalid gemm2 profile id`, "
        f"{_ids(s.other_kernel)} silently run another kernel, {_ids(s.same_kernel)} the same "
        f"kernel (tactic lists {lists.flashinfer.source}; bf16 assumed)"
    )
    return text, details


def _ids(ids: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, ids)) + "]" if ids else "none"


def _sglang_either_mode(view: Any, target: Any) -> bool:
    """An SGLang rank file outside the store, for a release that reads the finalize variable."""
    v = parse_version(target.sglang_version)
    return (
        view.cache.found.layout == "sglang"
        and view.namespace_dir is None
        and v is not None
        and v >= SGLANG_FINALIZE_FROM
    )


def stale_gemm2_profile(inp: Inputs) -> Iterator[Finding]:
    target = inp.target
    target_fi = parse_version(target.fingerprint.flashinfer_version)
    if target_fi is not None and target_fi >= FLASHINFER_FINALIZE_IN_KEY:
        return  # its keys carry use_fused_finalize: an old entry can never be replayed
    runs = runs_finalize(inp)  # finalize-unsupported: an unfused ask may still start fused
    for view in inp.caches:
        if not view.applies:
            continue
        tactics = _gemm2_tactics(view.cache.file)
        if not tactics:
            continue
        tuned = _tuned_mode(view)
        if _sglang_either_mode(view, target):
            # SGLang 0.5.18+ tunes both modes into one rank file: its path never says which
            other = "unfused" if runs == "fused" else "fused"
            tuned = _Tuned(other, "SGLang writes both modes into the same rank file, so possibly")
        path = str(view.cache.path)
        if tuned.mode == runs:
            if runs != target.finalize:
                yield Finding(
                    "stale-gemm2-profile",
                    "info",
                    path,
                    f"{len(tactics)} MoE GEMM2 entries here were tuned {tuned.mode} "
                    f"({tuned.why}); the target asks for {target.finalize}, but {_vllm(inp)} "
                    f"starts {runs} (see finalize-unsupported), so they load as they were tuned",
                    f"nothing to do for this vLLM; keep the file away from a start that really "
                    f"runs {target.finalize}",
                )
            continue
        counts = _counts(view)
        detail = f"{len(tactics)} GEMM2 tactic ids ({min(tactics)}..{max(tactics)})"
        split = _measured_split(view, inp, tactics, tuned.mode, counts, runs)
        if split is not None:
            text, details = split
            detail += text
        elif counts and runs in counts[1]:
            limit = counts[0] + counts[1][runs]
            crash = sum(t >= limit for t in tactics)
            detail += (
                f": {crash} are beyond the {runs} list (ids < {limit}) and crash "
                f"start-up, {len(tactics) - crash} silently pick another kernel"
            )
        else:
            detail += (
                ": ids beyond the target's list crash start-up with `Invalid gemm2 profile "
                "id`, the others silently pick another kernel"
            )
        asks = (
            f"the target runs {runs}"
            if runs == target.finalize
            else f"the target asks for {target.finalize}, but {_vllm(inp)} starts {runs} "
            "(see finalize-unsupported)"
        )
        if selects_unfused(inp) is None and "unfused" in (runs, tuned.mode):
            asks += f" (if {_vllm(inp)} reads {VLLM_FINALIZE_ENV} at all: see finalize-unsupported)"
        # A guessed mode with no id that would crash: the file may well be of the target's mode.
        harmless = tuned.guessed and split is not None and not split[1]["crash_ids"]
        yield Finding(
            "stale-gemm2-profile",
            "warning" if harmless else "error",
            path,
            (
                "No id here is beyond the target's list, so nothing crashes, but nothing records "
                "the mode either: "
                if harmless
                else ""
            )
            + f"MoE GEMM2 entries here were tuned {tuned.mode} ({tuned.why}); {asks}. Their "
            f"keys (FlashInfer < {FLASHINFER_FINALIZE_IN_KEY}) do not record the finalize mode, "
            f"so that start replays them: {detail}",
            (
                "keep it if it was tuned unfused; if it was tuned fused, those ids run other "
                "kernels unfused: move it aside (doctor --fix leaves a warning alone) and warm "
                "through fi-cache, whose namespaces record the mode"
                if harmless
                else _stale_fix(inp, view, tuned, runs)
            ),
            details if split is not None else None,
        )


def _stale_fix(inp: Inputs, view: Any, tuned: _Tuned, runs: str) -> str:
    move = _quarantine_text(inp, str(view.cache.path), "move this file aside")
    if tuned.ignored_by_warm:
        # `warm --finalize unfused` wrote it: running that warm again tunes fused again.
        return (
            f"{move}; another `fi-cache warm --finalize unfused` with this vLLM tunes fused "
            "again: tune the unfused mode with FlashInfer itself (fi-cache plan "
            "--from-hf-config CONFIG -o plan.toml; fi-cache warm --engine flashinfer --plan "
            f"plan.toml --finalize unfused), or {ALTERNATIVES}"
        )
    serve = "fi-cache serve --deterministic" if runs == "unfused" else "fi-cache serve"
    return (
        f"{move}; keep {tuned.mode} and {runs} caches apart ({serve} uses the {runs} "
        f"namespace of the store; {VLLM_FINALIZE_ENV} picks the mode)"
    )


def _vllm(inp: Inputs) -> str:
    return f"vLLM {inp.target.vllm_version}" if inp.target.vllm_version else "the target vLLM"


def records_unreadable(inp: Inputs) -> Iterator[Finding]:
    target_fi = parse_version(inp.target.fingerprint.flashinfer_version)
    if target_fi is None or target_fi >= FLASHINFER_FINALIZE_IN_KEY:
        return
    for view in inp.caches:
        cf = view.cache.file
        if not view.applies or view.cache.found.format != "v1":
            continue
        if compare_metadata(cf.metadata, inp.target.fingerprint):
            continue  # FlashInfer skips the whole file before reading entries
        crash = next((d for d in view.defects if d.check == "records-unreadable"), None)
        if crash is not None:
            yield Finding(
                "records-unreadable",
                "error",
                str(view.cache.path),
                crash.message.replace("<= 0.6.17", str(target_fi)),
                "do not load FlashInfer >= 0.6.18 files in older FlashInfer; remove `_records` "
                "or give each version its own cache dir",
            )
        elif cf.generation is not None:
            yield Finding(
                "records-unreadable",
                "warning",
                str(view.cache.path),
                f"has `_generation`, which FlashInfer {target_fi} loads as a bogus entry",
                "harmless for lookups; give each FlashInfer version its own cache dir",
            )


def unreadable_permissions(inp: Inputs) -> Iterator[Finding]:
    yield from _problems(
        inp, "unreadable-permissions", lambda _: "check ownership and mode of the file or directory"
    )
    store_mode = inp.modes.get(inp.store) if inp.store else None
    if store_mode is not None and not store_mode & 0o055:
        return  # a private store (0700): only its owner is meant to read it
    for view in inp.caches:
        if view.namespace_dir is None:
            continue  # a private vLLM cache is 0600 by design; only the shared store matters
        closed = []
        for path in (view.cache.path, *view.cache.path.parents):
            mode = inp.modes.get(path)
            if mode is None:
                continue
            need = 0o055 if stat.S_ISDIR(mode) else 0o044
            if mode & need != need:
                closed.append(f"{path.name or path} ({stat.filemode(mode)})")
            if view.namespace_dir == path:
                break
        if closed:
            yield Finding(
                "unreadable-permissions",
                "warning",
                str(view.cache.path),
                "other users of this shared store cannot read "
                + ", ".join(closed)
                + " (FlashInfer writes 0600)",
                "chmod -R go+rX the namespace dir, or run every server as the same user",
            )


def finalize_mode_miss(inp: Inputs) -> Iterator[Finding]:
    """FlashInfer 0.6.18+ keys carry the finalize mode: a file whose MoE entries are all of the
    other mode crashes nothing, but gives the target no hit at all (an H200 run: 0 of 12
    buckets, both GEMMs ran the fallback tactic -1)."""
    target = inp.target
    target_fi = parse_version(target.fingerprint.flashinfer_version)
    if target_fi is None or target_fi < FLASHINFER_FINALIZE_IN_KEY:
        return  # older keys cannot tell the modes apart: stale-gemm2-profile's business
    for view in inp.caches:
        mode = view.cache.finalize()
        if not view.applies or mode not in ("fused", "unfused") or mode == target.finalize:
            continue
        yield Finding(
            "finalize-mode-miss",
            "warning",
            str(view.cache.path),
            f"every MoE entry here was tuned {mode}; the target runs {target.finalize}, and "
            f"FlashInfer {target_fi} keys carry the mode, so none matches: where tuning is off "
            "(a replay-only engine, `autotune(False, ...)`) every MoE call runs FlashInfer's "
            "untuned fallback tactic, and a tuning start tunes "
            f"{target.finalize} into this same file (both modes then live in it)",
            f"tune the {target.finalize} mode before serving without tuning "
            f"(fi-cache warm --finalize {target.finalize} gives it a namespace of its own)",
        )


def not_loaded(inp: Inputs) -> Iterator[Finding]:
    """A cache the user named that the target never reads gets the integrity checks only: say so,
    or silence reads as "fine for this target"."""
    for view in inp.caches:
        if view.named and not view.applies:
            yield Finding(
                "not-loaded",
                "info",
                str(view.cache.path),
                f"the target never loads this cache: {view.not_loaded_why}; only its integrity "
                "was checked, not whether it fits the target",
                "to vet it for the environment it was made for, name that one (--flashinfer-"
                "version, --gpu, --finalize), or copy it where the target reads",
            )


def tmp_leftover(inp: Inputs) -> Iterator[Finding]:
    for path, age in inp.tmp_files:
        staging = path.name.startswith(STAGING_PREFIX)
        if age >= TMP_MAX_AGE_S:
            yield Finding(
                "tmp-leftover",
                "warning",
                str(path),
                f"staging dir of a killed import, untouched for {age / 60:.0f} minutes"
                if staging
                else f"temp file of a killed writer, {age / 60:.0f} minutes old",
                "delete it (doctor --fix does)",
            )
        else:
            yield Finding(
                "tmp-leftover",
                "info",
                str(path),
                f"staging dir touched {age:.0f}s ago: an import may still be running"
                if staging
                else f"temp file {age:.0f}s old: a writer may still be running",
                "leave it; check again later",
            )


def no_target(inp: Inputs) -> Iterator[Finding]:
    """Nothing about the target is known: the checks against it had nothing to compare with."""
    t, fp = inp.target, inp.target.fingerprint
    if inp.logs and not inp.caches:
        return  # a log alone: what it says needs no target
    if (
        t.vllm_version
        or t.sglang_version
        or any((fp.flashinfer_version, fp.cuda_version, fp.gpu, fp.arch))
    ):
        return
    yield Finding(
        "no-target",
        "info",
        None,
        "no target given and none detected here (no FlashInfer, GPU or engine version): only "
        "the files' integrity was checked, not whether a start would load, hit or crash on them",
        "run doctor on the serving machine, or name the target: --flashinfer-version V --gpu "
        "NAME [--vllm-version V | --sglang-version V] [--finalize fused|unfused] [-- ARGS]",
    )


CHECKS = (
    Check(
        "corrupt-file",
        "unreadable or truncated JSON, unparsable keys, malformed values",
        corrupt_file,
    ),
    Check(
        "generation-mismatch",
        "`_generation` present but not the content's hash",
        generation_mismatch,
    ),
    Check(
        "foreign-environment",
        "`_metadata` does not fit the target (FlashInfer ignores the file); or a log saying so",
        foreign_environment,
    ),
    Check(
        "stale-gemm2-profile",
        "MoE GEMM2 entries tuned in another finalize mode than the "
        "target's, in keys that cannot tell (FlashInfer <= 0.6.17); or a log with the crash",
        stale_gemm2_profile,
    ),
    Check(
        "finalize-mode-miss",
        "MoE entries only of the other finalize mode (FlashInfer >= 0.6.18: no hit, fallback "
        "tactic); or a log with FlashInfer's fallback lines",
        finalize_mode_miss,
    ),
    Check(
        "records-unreadable",
        "`_records` a FlashInfer <= 0.6.17 target would crash on",
        records_unreadable,
    ),
    Check(
        "unreadable-permissions",
        "caches other users of a shared store cannot read",
        unreadable_permissions,
    ),
    Check(
        "not-loaded",
        "a cache named on the command line that the target never loads (another version's dir, "
        "another namespace)",
        not_loaded,
    ),
    Check("tmp-leftover", "temp files of killed writers", tmp_leftover),
    Check("no-target", "no target given or detected: only integrity was checked (info)", no_target),
)
