"""Every doctor check, positive and negative, on real-format files: Inputs in, findings out."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fi_cache import doctor
from fi_cache.caches.discover import classify_file
from fi_cache.caches.inventory import read
from fi_cache.doctor import CacheView, Inputs, Target
from fi_cache.doctor.logs import CacheEvent, LogFacts, ProfileIdError
from fi_cache.engines.vllm.args import parse_serve_args
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint, compare_metadata
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import Namespace
from tests.conftest import GEMM_617, GEMM_618, MOE_617_FUSED, MOE_617_UNFUSED, MOE_618_FUSED

H200_617 = json.loads(GEMM_617.read_text())["_metadata"]
H200_618 = json.loads(GEMM_618.read_text())["_metadata"]


def _target(meta: dict[str, str] = H200_617, **kw: object) -> Target:
    return Target(Fingerprint.from_metadata(meta, "90a"), **kw)  # type: ignore[arg-type]


def _view(
    path: Path, ns: str | None = None, manifest: Manifest | None = None, tmp: Path | None = None
) -> CacheView:
    if tmp is not None:
        shutil.copy(path, tmp / path.name)
        path = tmp / path.name
    cache = read(classify_file(path))
    defects = (*cache.read_defects, *v1.defects(cache.file))
    return CacheView(cache, path.parent if ns else None, ns, manifest, defects)


def _ids(inputs: Inputs, check: str) -> list[tuple[str, str | None]]:
    return [(f.severity, f.path) for f in doctor.run(inputs, [check])]


# --- stale-gemm2-profile ---


def test_the_collision_unrecorded_0617_moe_cache_and_an_unfused_target() -> None:
    inputs = Inputs(_target(finalize="unfused"), (_view(MOE_617_FUSED),))
    [f] = doctor.run(inputs, ["stale-gemm2-profile"])
    assert f.severity == "error" and f.path == str(MOE_617_FUSED)
    assert "16 GEMM2 tactic ids (60..124)" in f.message and "Invalid gemm2 profile id" in f.message


def test_the_stale_message_says_why_it_was_fused_in_plain_words() -> None:
    [f] = doctor.run(Inputs(_target(finalize="unfused"), (_view(MOE_617_FUSED),)))[:1]
    assert (
        "were tuned fused (most likely: nothing records how this file was tuned, and every "
        "vLLM release up to 0.34.0 tunes fused" in f.message
    )
    assert "probably (no record" not in f.message


def test_a_warm_that_tuned_fused_into_the_unfused_namespace_is_not_advised_again() -> None:
    """`warm --finalize unfused` with a vLLM that ignores the variable tunes fused; doctor must
    not send the user back to that same warm (or to serve --deterministic, which runs it)."""
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "unfused")
    for supports in (False, None):  # ignores it, or fi-cache could not tell
        m = Manifest.new(ns).with_warm(WarmRecord(0, 1, "0.32.0", ["m"], "k", [], supports))
        view = _view(MOE_617_FUSED, "unfused", m)
        [f] = doctor.run(Inputs(_target(finalize="unfused"), (view,)), ["stale-gemm2-profile"])
        assert f.severity == "error"
        assert "serve --deterministic" not in f.fix and "serve [--deterministic]" not in f.fix
        assert (
            "another `fi-cache warm --finalize unfused` with this vLLM tunes fused again" in f.fix
        )
        assert "warm --engine flashinfer" in f.fix and "VLLM_BATCH_INVARIANT=1" in f.fix


def test_an_unfused_cache_on_a_vllm_that_starts_fused_is_stale_for_fused() -> None:
    """finalize-unsupported decides what starts: asked for unfused, vLLM 0.30 runs fused, so a
    cache tuned unfused (by FlashInfer itself) is replayed in the fused kernel."""
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "unfused")
    m = Manifest.new(ns).with_warm(WarmRecord(0, 1, None, ["--plan", "p"], "k", [], True))
    target = _target(finalize="unfused", vllm_version="0.30.0")
    [f] = doctor.run(Inputs(target, (_view(MOE_617_UNFUSED, "unfused", m),)))[:1]
    assert (f.check, f.severity) == ("finalize-unsupported", "error")
    [g] = doctor.run(
        Inputs(target, (_view(MOE_617_UNFUSED, "unfused", m),)), ["stale-gemm2-profile"]
    )
    assert g.severity == "error" and "were tuned unfused" in g.message
    assert "vLLM 0.30.0 starts fused (see finalize-unsupported)" in g.message


def test_fused_target_with_an_unrecorded_cache_is_fine() -> None:
    assert (
        _ids(Inputs(_target(finalize="fused"), (_view(MOE_617_FUSED),)), "stale-gemm2-profile")
        == []
    )


def test_recorded_unfused_namespace_and_a_fused_target_is_an_error_too() -> None:
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "unfused")
    m = Manifest.new(ns).with_warm(WarmRecord(0, 1, "0.34.0", ["m"], "k", [], True))
    view = _view(MOE_617_UNFUSED, "unfused", m)
    [f] = doctor.run(Inputs(_target(finalize="fused"), (view,)), ["stale-gemm2-profile"])
    assert "were tuned unfused" in f.message
    assert doctor.run(Inputs(_target(finalize="unfused"), (view,)), ["stale-gemm2-profile"]) == []


def test_unfused_namespace_warmed_by_a_vllm_that_ignored_the_variable() -> None:
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "unfused")
    m = Manifest.new(ns).with_warm(WarmRecord(0, 1, "0.30.0", ["m"], "k", [], False))
    [f] = doctor.run(
        Inputs(_target(finalize="unfused"), (_view(MOE_617_FUSED, "unfused", m),)),
        ["stale-gemm2-profile"],
    )
    assert "were tuned fused" in f.message


def test_a_file_copied_into_a_recorded_unfused_namespace_is_not_vouched_for(
    tmp_path: Path,
) -> None:
    """The unfused warm vouches for the file it wrote, not for a fused one copied in beside it."""
    ns_dir = tmp_path / "unfused-ns"
    own, copied = ns_dir / "vllm" / "a" / "autotune_configs.json", ns_dir / "vllm" / "b" / "c.json"
    for src, dst in ((MOE_617_UNFUSED, own), (MOE_617_FUSED, copied)):
        dst.parent.mkdir(parents=True)
        shutil.copy(src, dst)
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "unfused")
    rec = CacheFileRecord("vllm/a/autotune_configs.json", 32, own.stat().st_size)
    m = Manifest.new(ns).with_warm(WarmRecord(0, 1, "0.34.0", ["m"], "k", [rec], True))
    views = []
    for path in (own, copied):
        cache = read(classify_file(path))
        views.append(CacheView(cache, ns_dir, "unfused", m, v1.defects(cache.file)))
    [f] = doctor.run(Inputs(_target(finalize="unfused"), tuple(views)), ["stale-gemm2-profile"])
    assert f.path == str(copied) and "most likely" in f.message


def test_known_tactic_counts_split_crash_from_silent(tmp_path: Path) -> None:
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "fused")
    m = Manifest.new(ns)
    m = Manifest(
        m.fingerprint,
        "fused",
        0,
        0,
        (),
        {"tactic_counts": {"gemm1": 45, "gemm2": {"fused": 81, "unfused": 36}}},
    )
    view = _view(MOE_617_FUSED, "fused", m)
    # An SM no tactic lists were measured for (the H200's SM90 has them): the counts decide.
    target = Target(Fingerprint.from_metadata(H200_617, "100a"), finalize="unfused")
    [f] = doctor.run(Inputs(target, (view,)), ["stale-gemm2-profile"])
    tactics = [v[1] for k, v in json.loads(MOE_617_FUSED.read_text()).items() if "gemm2" in k]
    crash = sum(t >= 81 for t in tactics)
    assert crash == 8
    assert f"{crash} are beyond the unfused list (ids < 81) and crash start-up" in f.message


def test_0618_target_never_replays_old_keys() -> None:
    inputs = Inputs(_target(H200_618, finalize="unfused"), (_view(MOE_617_FUSED),))
    assert _ids(inputs, "stale-gemm2-profile") == []


def test_0618_keys_carry_the_mode_so_no_collision() -> None:
    inputs = Inputs(_target(H200_617, finalize="unfused"), (_view(MOE_618_FUSED),))
    assert _ids(inputs, "stale-gemm2-profile") == []


def test_log_with_the_crash_names_the_loaded_cache() -> None:
    log = LogFacts(
        "vllm.log",
        (CacheEvent("loaded", "/c/autotune_configs.json", 10, 32),),
        (ProfileIdError(2, 50, 99, "/c/autotune_configs.json"),),
        (),
        120,
    )
    [f] = doctor.run(Inputs(_target(), logs=(log,)), ["stale-gemm2-profile"])
    assert f.severity == "error" and f.path == "/c/autotune_configs.json"
    assert "vllm.log:99" in f.message and "Invalid gemm2 profile id: 50" in f.message


# --- foreign-environment ---


def test_h100_target_and_an_h200_cache() -> None:
    target = _target({**H200_617, "gpu": "NVIDIA H100 80GB HBM3"})
    [f] = doctor.run(Inputs(target, (_view(GEMM_617),)), ["foreign-environment"])
    assert f.severity == "error" and "never overwrites it" in f.message
    assert "gpu: saved 'NVIDIA H200', target 'NVIDIA H100 80GB HBM3'" in f.message


def test_unknown_target_fields_are_not_compared() -> None:
    target = Target(Fingerprint(flashinfer_version="0.6.17"))  # a CPU box: nothing else known
    assert _ids(Inputs(target, (_view(GEMM_617),)), "foreign-environment") == []


def test_indeterminate_saved_value_is_a_warning(tmp_path: Path) -> None:
    data = json.loads(GEMM_617.read_text())
    data["_metadata"]["cudnn_version"] = "unknown"
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    [f] = doctor.run(Inputs(_target(), (_view(path),)), ["foreign-environment"])
    assert f.severity == "warning" and "replaces it at the next save" in f.message


def test_log_line_of_an_ignored_cache() -> None:
    event = CacheEvent(
        "ignored",
        "/c.json",
        7,
        hard=True,
        mismatches=(("gpu", "NVIDIA H100 80GB HBM3", "NVIDIA H200"),),
    )
    log = LogFacts("x.log", (event,), (), (), 10)
    [f] = doctor.run(Inputs(_target(), logs=(log,)), ["foreign-environment"])
    assert f.severity == "warning" and "re-tunes at every start" in f.message


# --- integrity ---


def test_corrupt_and_generation_mismatch(tmp_path: Path) -> None:
    data = json.loads(GEMM_618.read_text())
    key = next(k for k in data if k.startswith("("))
    data[key][1] = 9
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"('a', 'b', (1,": ["R", 1]}))
    inputs = Inputs(_target(H200_618), (_view(edited), _view(bad)))
    assert _ids(inputs, "generation-mismatch") == [("warning", str(edited))]
    assert _ids(inputs, "corrupt-file") == [("error", str(bad))]
    assert _ids(Inputs(_target(H200_618), (_view(GEMM_618),)), "corrupt-file") == []


def test_records_crash_a_0617_reader(tmp_path: Path) -> None:
    data = json.loads(GEMM_617.read_text())
    data["_metadata"]["flashinfer_version"] = "*"  # forced to load: the hazard
    data["_records"] = {"ns": {"a": 1}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    [f] = doctor.run(Inputs(_target(), (_view(path),)), ["records-unreadable"])
    assert f.severity == "error" and "KeyError: 0" in f.message
    assert _ids(Inputs(_target(H200_618), (_view(path),)), "records-unreadable") == []
    # an ordinary 0.6.18 file is skipped by a 0.6.17 reader before entries are read
    assert _ids(Inputs(_target(), (_view(GEMM_618),)), "records-unreadable") == []


def test_tmp_leftovers_by_age() -> None:
    inputs = Inputs(
        _target(),
        tmp_files=((Path("/s/.autotuner_a.tmp"), 3600.0), (Path("/s/.autotuner_b.tmp"), 5.0)),
    )
    assert _ids(inputs, "tmp-leftover") == [
        ("warning", "/s/.autotuner_a.tmp"),
        ("info", "/s/.autotuner_b.tmp"),
    ]


def test_shared_store_file_that_others_cannot_read(tmp_path: Path) -> None:
    view = _view(GEMM_617, "fused", tmp=tmp_path)
    path = view.cache.path
    modes = {path: 0o100600, tmp_path: 0o040755}
    [f] = doctor.run(Inputs(_target(), (view,), modes=modes), ["unreadable-permissions"])
    assert f.severity == "warning" and "-rw-------" in f.message
    ok = {path: 0o100644, tmp_path: 0o040755}
    assert _ids(Inputs(_target(), (view,), modes=ok), "unreadable-permissions") == []
    private = _view(GEMM_617)  # a vLLM cache outside the store: 0600 is by design
    assert (
        _ids(
            Inputs(_target(), (private,), modes={private.cache.path: 0o100600}),
            "unreadable-permissions",
        )
        == []
    )


# --- vLLM ---


@pytest.mark.parametrize(
    "version, supports, finalize, expected",
    [
        ("0.30.0", None, "unfused", "error"),  # a known release: none has the variable
        ("0.30.0", False, "unfused", "error"),
        (None, None, "unfused", "warning"),
        ("0.35.0", True, "unfused", None),
        ("0.30.0", False, "fused", None),
    ],
)
def test_finalize_unsupported(
    version: str | None, supports: bool | None, finalize: str, expected: str | None
) -> None:
    t = _target(vllm_version=version, vllm_supports_finalize=supports, finalize=finalize)
    found = [s for s, _ in _ids(Inputs(t), "finalize-unsupported")]
    assert found == ([expected] if expected else [])


@pytest.mark.parametrize(
    "version, argv, hit",
    [
        (
            "0.21.0",
            "-tp 2 -dp 2 --enable-expert-parallel --all2all-backend flashinfer_all2allv",
            True,
        ),
        ("0.18.0", "-tp 2 -dp 2 -ep --all2all-backend flashinfer_nvlink_one_sided", True),
        # 0.15.1 has the same unreduced combine (flashinfer_cutlass_prepare_finalize.py:57-58)
        ("0.15.1", "-tp 2 -dp 2 -ep --all2all-backend flashinfer_all2allv", True),
        # 0.14.1 and 0.15.0 too: output_is_reduced() False, the same all2all condition
        ("0.14.1", "-tp 2 -dp 2 -ep --all2all-backend flashinfer_all2allv", True),
        ("0.15.0", "-tp 2 -dp 2 -ep --all2all-backend flashinfer_all2allv", True),
        ("0.22.0", "-tp 2 -dp 2 -ep --all2all-backend flashinfer_all2allv", False),
        ("0.21.0", "-tp 1 -dp 4 -ep --all2all-backend flashinfer_all2allv", False),
        ("0.21.0", "-tp 2 -dp 2 -ep --all2all-backend deepep_low_latency", False),
        # the all2all kernels need data parallel > 1 AND expert parallel: no false positive
        ("0.21.0", "-tp 2 --all2all-backend flashinfer_all2allv", False),
        ("0.21.0", "-tp 2 -dp 2 --all2all-backend flashinfer_all2allv", False),
        ("0.16.0", "-tp 2 --enable-expert-parallel --all2all-backend flashinfer_all2allv", False),
    ],
)
def test_double_reduce(version: str, argv: str, hit: bool) -> None:
    inputs = Inputs(_target(vllm_version=version), serve=parse_serve_args(["m", *argv.split()]))
    assert bool(_ids(inputs, "double-reduce")) == hit


@pytest.mark.parametrize("version, hit", [("0.15.0", True), ("0.16.0", False)])
def test_double_reduce_from_the_environment_variable(version: str, hit: bool) -> None:
    """0.14.1-0.15.x take the backend from VLLM_ALL2ALL_BACKEND when the flag is absent."""
    serve = parse_serve_args(["m", "-tp", "2", "-dp", "2", "-ep"])
    env = {"VLLM_ALL2ALL_BACKEND": "flashinfer_all2allv"}
    inputs = Inputs(_target(vllm_version=version), serve=serve, environ=env)
    found = _ids(inputs, "double-reduce")
    assert bool(found) == hit


def test_warm_cache_hang_needs_version_world_size_and_a_warm_cache(tmp_path: Path) -> None:
    vllm_dir = tmp_path / "0.6.17" / "90a"
    path = vllm_dir / ("a" * 64) / "autotune_configs.json"
    path.parent.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, path)
    view = _view(path)
    tp2 = parse_serve_args(["m", "-tp", "2"])
    hit = Inputs(_target(vllm_version="0.30.0"), (view,), serve=tp2, predicted_dir=vllm_dir)
    assert _ids(hit, "warm-cache-hang") == [("warning", str(path))]
    assert _ids(
        Inputs(_target(vllm_version="0.31.0"), (view,), serve=tp2, predicted_dir=vllm_dir),
        "warm-cache-hang",
    ) == [("warning", str(path))]
    for miss in (
        # 0.32: per-rank files and a unanimous-load gate (kernel_warmup.py:394-401, 453-476)
        Inputs(_target(vllm_version="0.32.0"), (view,), serve=tp2, predicted_dir=vllm_dir),
        Inputs(_target(vllm_version="0.33.0"), (view,), serve=tp2, predicted_dir=vllm_dir),
        Inputs(
            _target(vllm_version="0.30.0"),
            (view,),
            serve=parse_serve_args(["m"]),
            predicted_dir=vllm_dir,
        ),
        Inputs(_target(vllm_version="0.30.0"), (), serve=tp2, predicted_dir=vllm_dir),
    ):
        assert _ids(miss, "warm-cache-hang") == []
    old = Inputs(_target(vllm_version="0.25.1"), (view,), serve=tp2, predicted_dir=vllm_dir)
    assert doctor.run(old, ["warm-cache-hang"]) == []
    assert [f.check for f in doctor.run(old, ["cache-unused"])] == ["cache-unused"]


def test_removed_env() -> None:
    env = {
        "VLLM_USE_FLASHINFER_MOE_FP8": "1",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16": "1",
        "VLLM_USE_FLASHINFER_MOE_INT4": "1",
        "VLLM_FLASHINFER_MOE_BACKEND": "throughput",
    }
    found = doctor.run(Inputs(_target(vllm_version="0.24.0"), environ=env), ["removed-env"])
    assert sorted(f.message.split()[0] for f in found) == [
        "VLLM_FLASHINFER_MOE_BACKEND",
        "VLLM_USE_FLASHINFER_MOE_FP8",
        "VLLM_USE_FLASHINFER_MOE_MXFP4_BF16",
    ]
    assert doctor.run(Inputs(_target(vllm_version="0.23.1"), environ=env), ["removed-env"]) == []


def test_every_contract_check_id_is_registered() -> None:
    ids = {c.id for c in doctor.checks()}
    assert {
        "stale-gemm2-profile",
        "foreign-environment",
        "corrupt-file",
        "generation-mismatch",
        "tmp-leftover",
        "records-unreadable",
        "unreadable-permissions",
        "finalize-unsupported",
        "double-reduce",
        "warm-cache-hang",
        "removed-env",
    } <= ids


def test_finalize_unsupported_is_moot_when_moe_is_not_on_flashinfer() -> None:
    t = _target(vllm_version="0.30.0", vllm_supports_finalize=False, finalize="unfused")
    triton = Inputs(t, serve=parse_serve_args(["m", "--moe-backend", "triton"]))
    assert _ids(triton, "finalize-unsupported") == []
    invariant = Inputs(t, environ={"VLLM_BATCH_INVARIANT": "1"})
    assert _ids(invariant, "finalize-unsupported") == []
    cutlass = Inputs(t, serve=parse_serve_args(["m", "--moe-backend", "flashinfer_cutlass"]))
    assert _ids(cutlass, "finalize-unsupported") == [("error", None)]


def test_cache_unused_is_silent_when_autotune_is_off() -> None:
    old = _target(vllm_version="0.25.1")
    assert _ids(Inputs(old, serve=parse_serve_args(["m", "-tp", "2", "-O0"])), "cache-unused") == []
    assert _ids(Inputs(old, serve=parse_serve_args(["m", "-tp", "2"])), "cache-unused") == [
        ("info", None)
    ]


def test_a_private_store_gets_no_sharing_advice(tmp_path: Path) -> None:
    view = _view(GEMM_617, "fused", tmp=tmp_path)
    modes = {view.cache.path: 0o100600, tmp_path: 0o040755, tmp_path.parent: 0o040700}
    private = Inputs(_target(), (view,), modes=modes, store=tmp_path.parent)
    assert _ids(private, "unreadable-permissions") == []
    shared = Inputs(
        _target(), (view,), modes={**modes, tmp_path.parent: 0o040755}, store=tmp_path.parent
    )
    assert [s for s, _ in _ids(shared, "unreadable-permissions")] == ["warning"]


def test_the_stale_gemm2_split_is_what_the_h200_did() -> None:
    """The fused-tuned 0.6.17 file from the H200 run, replayed unfused there: the buckets whose
    GEMM2 id doctor calls a crash died with `Invalid gemm2 profile id`, the one it calls another
    kernel ran (tests/fixtures/h200-moe-run/0.6.17/replay-unfused-under-fused.json)."""
    import json

    from tests.conftest import FIXTURES

    run = FIXTURES / "h200-moe-run" / "0.6.17"
    view = _view(run / "fused-namespace.json")
    target = _target(vllm_version=None, vllm_supports_finalize=None, finalize="unfused")
    [f] = [f for f in doctor.run(Inputs(target, (view,)), ["stale-gemm2-profile"])]
    assert f.details is not None
    replay = json.loads((run / "replay-unfused-under-fused.json").read_text())
    died, ran = set(), set()
    for bucket in replay["buckets"]:
        [gemm2] = [c["tactic"] for c in bucket["choices"] if c["op"] == "gemm2"]
        (ran if bucket["ok"] else died).add(gemm2)
    assert set(f.details["crash_ids"]) == died == {99, 100, 102, 104}
    assert set(f.details["other_kernel_ids"]) == ran == {75}
    assert f.details["tactic_counts"] == {"gemm1": 45, "gemm2": {"fused": 81, "unfused": 45}}
    assert "Invalid gemm2 profile id" in f.message and "bf16 assumed" in f.message


def test_an_unrecorded_file_none_of_whose_ids_crash_is_a_warning_not_an_error() -> None:
    """fi-cache's own unfused H200 file, copied out of its namespace: nothing records the mode,
    and every GEMM2 id is within the unfused list, so nothing would crash start-up."""
    from tests.conftest import FIXTURES

    view = _view(FIXTURES / "h200-moe-run" / "0.6.17" / "unfused-namespace.json")
    target = _target(vllm_version=None, vllm_supports_finalize=None, finalize="unfused")
    [f] = doctor.run(Inputs(target, (view,)), ["stale-gemm2-profile"])
    assert f.severity == "warning" and f.details is not None and f.details["crash_ids"] == []
    assert f.message.startswith("No id here is beyond the target's list, so nothing crashes")
    assert "doctor --fix leaves a warning alone" in f.fix


def test_a_sweep_log_is_one_finding_per_process_not_one_per_call() -> None:
    """The H200 sweep (one process, every bucket tried, each error caught): 11 failed calls, one
    finding that says the process went on."""
    from fi_cache.doctor.logs import read_log
    from tests.conftest import FIXTURES

    log = read_log(FIXTURES / "h200-moe-run" / "0.6.17" / "replay-unfused-under-fused.log")
    assert len(log.errors) == 11
    [f] = doctor.run(Inputs(_target(finalize="unfused"), logs=(log,)), ["stale-gemm2-profile"])
    assert "11 calls failed with `Invalid gemm2 profile id` (ids 99, 100, 102, 104" in f.message
    assert "went on" in f.message


def test_the_other_modes_silent_cliff_on_0618() -> None:
    """FlashInfer 0.6.18 keys carry the mode: a fused-only file gives an unfused target no hit
    (the H200 replay: tactic -1 for all 24 GEMM calls); a file with both modes is fine."""
    from fi_cache.doctor.logs import read_log
    from tests.conftest import FIXTURES

    run = FIXTURES / "h200-moe-run" / "0.6.18"
    unfused = _target(H200_618, finalize="unfused")
    fused_only = _view(run / "fused-namespace.json")
    [f] = doctor.run(Inputs(unfused, (fused_only,)), ["finalize-mode-miss"])
    assert f.severity == "warning" and "every MoE entry here was tuned fused" in f.message
    both = _view(run / "both-modes.json")
    assert doctor.run(Inputs(unfused, (both,)), ["finalize-mode-miss"]) == []
    assert doctor.run(Inputs(_target(H200_618), (fused_only,)), ["finalize-mode-miss"]) == []
    log = read_log(run / "replay-unfused-under-fused.log")
    [g] = doctor.run(Inputs(unfused, logs=(log,)), ["finalize-mode-miss"])
    assert "24 MoE calls found no tuned entry and ran FlashInfer's fallback tactic -1" in g.message


@pytest.mark.parametrize("gemm2", [[81, 36], "81", {"unfused": 1e999}])
def test_malformed_tactic_counts_are_ignored_not_a_crash(gemm2: object) -> None:
    ns = Namespace(Fingerprint.from_metadata(H200_617, "90a"), "fused")
    counts = {"tactic_counts": {"gemm1": 45, "gemm2": gemm2}}
    m = Manifest(ns.fingerprint, "fused", 0, 0, (), counts)
    view = _view(MOE_617_FUSED, "fused", m)
    [f] = doctor.run(Inputs(_target(finalize="unfused"), (view,)), ["stale-gemm2-profile"])
    plain = _view(MOE_617_FUSED, "fused", Manifest(ns.fingerprint, "fused", 0, 0, ()))
    [g] = doctor.run(Inputs(_target(finalize="unfused"), (plain,)), ["stale-gemm2-profile"])
    assert f.message == g.message and f.details == g.details  # as if the manifest had no counts


@pytest.mark.parametrize("value", [["NVIDIA H200"], {"x": 1}])
def test_a_metadata_value_of_another_json_type_is_a_hard_mismatch(value: object) -> None:
    meta = {**H200_617, "gpu": value}
    [mismatch] = compare_metadata(meta, _target().fingerprint)
    assert mismatch.field == "gpu" and mismatch.hard


def test_doctor_with_nothing_known_of_the_target_says_only_integrity_was_checked() -> None:
    view = _view(GEMM_618)
    [f] = doctor.run(Inputs(Target(Fingerprint()), (view,)), ["no-target"])
    assert f.severity == "info" and "only the files' integrity was checked" in f.message
    assert doctor.run(Inputs(_target(), (view,)), ["no-target"]) == []
