"""vLLM 0.34.0 read right: what changed from 0.33.0, checked against both releases' own code
(their wheels, tests/vllm_wheels.py)."""

from __future__ import annotations

import ast
import json
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import pytest

from fi_cache import doctor
from fi_cache.caches.discover import classify_file
from fi_cache.caches.inventory import read
from fi_cache.doctor import CacheView, Inputs, Target
from fi_cache.engines.vllm import predict as predict_module
from fi_cache.engines.vllm.args import _is_bool_flag, parse_serve_args
from fi_cache.engines.vllm.predict import predict
from fi_cache.model import v1
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store.manifest import CacheFileRecord, Manifest, WarmRecord
from fi_cache.store.namespace import Namespace
from fi_cache.versions import (
    VLLM_EXTENSIBLE_KV_SKIPS,
    VLLM_FINALIZE_ENV,
    VLLM_FLASHINFER_PINS,
    VLLM_IR_PROVIDER_FILES,
    VLLM_NEWEST_CHECKED,
    VLLM_SKIP_OPS_ENV,
    V,
)
from tests.conftest import GEMM_618, TINY_FAST, VLLM_PYTHON, needs_vllm
from tests.engines.vllm.counting_child import counting_child
from tests.engines.vllm.serve_flags import serve_flags
from tests.vllm_wheels import RELEASES, module_text, need, unpacked, vllm_wheel

H200_618 = json.loads(GEMM_618.read_text())["_metadata"]


@pytest.mark.parametrize("version", RELEASES)
def test_every_flag_vllm_takes_alone_is_read_alone_and_no_other(version: str) -> None:
    """fi-cache's table of valueless `vllm serve` flags agrees with the release's parser: the
    token after a valueless flag is the next argument, after any other flag its value."""
    need(version)
    flags = serve_flags(version)
    assert sorted(f for f in flags.valueless if not _is_bool_flag(f)) == []
    assert sorted(f for f in flags.valued if _is_bool_flag(f)) == []


def test_the_derivation_sees_the_flags_034_added() -> None:
    need("0.33.0")
    need("0.34.0")
    new = serve_flags("0.34.0").valueless - serve_flags("0.33.0").valueless
    assert {"--checkpoint-prepare-on-startup", "--shuffle-safetensors-files"} <= new


@pytest.mark.parametrize("flag", ["--shuffle-safetensors-files", "--checkpoint-prepare-on-startup"])
def test_a_034_flag_before_tp_keeps_tp(flag: str) -> None:
    args = parse_serve_args(["Qwen/Qwen3-8B", flag, "-tp", "2"])
    assert (args.model, args.tp, args.world_size) == ("Qwen/Qwen3-8B", 2, 2)
    args = parse_serve_args([flag, "Qwen/Qwen3-8B", "-tp", "2"])
    assert (args.model, args.tp) == ("Qwen/Qwen3-8B", 2)


def test_a_saved_answer_is_not_reused_after_an_edit_to_a_hashed_ir_op_provider(
    tmp_path: Path,
) -> None:
    """vLLM hashes the source of the IR-op implementations its priority lists name (a patched
    vllm_c.py is another hash dir, with the same dist-info): the saved answer is not reused
    (a STAND-IN child: it counts the asks)."""
    child, site = counting_child(tmp_path, "0.34.0"), tmp_path / "site"
    state = tmp_path / "state"
    (site / "vllm-0.34.0.dist-info").mkdir(parents=True)
    for rel in VLLM_IR_PROVIDER_FILES:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("def rms_norm(x): ...\n")

    def ask() -> int:
        predict(str(child.python), "0.34.0", ["m"], {}, state, site=str(site))
        return child.asked()

    assert ask() == 1 and ask() == 1
    (site / "vllm/kernels/vllm_c.py").write_text("def rms_norm(x): return x\n")
    assert ask() == 2 and ask() == 2
    (site / "vllm/ir/ops/activation.py").unlink()
    assert ask() == 3


@pytest.mark.parametrize("version", RELEASES)
def test_the_ir_op_provider_files_are_those_cudas_priority_lists_name(version: str) -> None:
    """The providers named in CUDA's default IR-op priority lists (platforms/cuda.py
    get_default_ir_op_priority) and the file of each op's implementation by that provider
    (`register_impl("<provider>")` in vllm/kernels, `@register_op` for native): those whose
    text vLLM hashes, so those whose text fi-cache keys its saved answer on."""
    need(version)
    root = unpacked(version)
    cuda = ast.parse((root / "vllm/platforms/cuda.py").read_text())
    method = next(
        n
        for n in ast.walk(cuda)
        if isinstance(n, ast.FunctionDef) and n.name == "get_default_ir_op_priority"
    )
    providers = {
        c.value
        for c in ast.walk(method)
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    } & {"native", "vllm_c", "oink", "triton", "aiter", "unfused"}
    assert providers == {"native", "vllm_c", "oink", "triton"}
    files = set()
    for path in (root / "vllm").rglob("*.py"):
        text = path.read_text()
        rel = str(path.relative_to(root))
        if rel.startswith("vllm/ir/ops/") and "@register_op" in text:
            files.add(rel)  # the native implementation is the op's own function
        for provider in providers - {"native"}:
            if re.search(rf"\.register_impl\(\s*\"{provider}\"", text):
                files.add(rel)
    assert files == set(VLLM_IR_PROVIDER_FILES)


def _function(version: str, module: str, name: str) -> ast.FunctionDef:
    text = module_text(version, module)
    return next(
        n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == name
    )


def _source(version: str, module: str, name: str) -> str:
    return ast.get_source_segment(module_text(version, module), _function(version, module, name))


_FAC = "vllm/model_executor/warmup/flashinfer_autotune_cache.py"
_WARMUP = "vllm/model_executor/warmup/kernel_warmup.py"


@pytest.mark.parametrize(
    "module, name",
    [
        (_FAC, "use_flashinfer_autotune_v2"),  # v1 or v2
        (_FAC, "flashinfer_autotune_filename"),  # the rank file names
        (_FAC, "resolve_rank_flashinfer_autotune_file"),
        (_FAC, "flashinfer_autotune_root"),
        (_FAC, "resolve_flashinfer_autotune_v2_root"),
        (_FAC, "sync_flashinfer_autotune_cache"),
        (_WARMUP, "_autotune_cache_fingerprint"),  # the gate
        (_WARMUP, "_all_ranks_have_matching_cache"),
        (_WARMUP, "_load_shared_autotune_cache"),
    ],
)
def test_what_fi_cache_models_of_033_is_034s_code_byte_for_byte(module: str, name: str) -> None:
    need("0.33.0")
    need("0.34.0")
    assert _source("0.33.0", module, name) == _source("0.34.0", module, name)


@pytest.mark.parametrize("version", RELEASES)
def test_the_prediction_runs_vllms_own_hash_with_all_it_reads(version: str) -> None:
    """predict_child.py passes vLLM's `flashinfer_autotune_cache_hash` a stand-in runner that
    holds only `vllm_config`: the function reads nothing else of it, so the child computes the
    release's own hash, 0.34's from the compile factors and 0.33's from compute_hash."""
    need(version)
    fn = _function(version, _FAC, "flashinfer_autotune_cache_hash")
    runner = fn.args.args[0].arg
    read = {
        n.attr
        for n in ast.walk(fn)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == runner
    }
    assert read == {"vllm_config"}
    body = ast.unparse(fn)
    if version == "0.34.0":
        assert "hash_factors(vllm_config.compile_factors(include_version=False))" in body
    else:
        assert "compute_hash(include_version=False)" in body and "hash_factors" not in body
    child = Path(predict_module.CHILD).read_text()
    assert "fac.flashinfer_autotune_cache_hash(types.SimpleNamespace(vllm_config=cfg))" in child


def test_034_names_no_finalize_variable_and_pins_a_flashinfer_pypi_lacks() -> None:
    """VLLM_NEWEST_CHECKED is 0.34.0: its code reads no VLLM_FLASHINFER_MOE_FUSED_FINALIZE, and
    its METADATA pins the FlashInfer of VLLM_FLASHINFER_PINS."""
    need("0.34.0")
    assert V("0.34.0") == VLLM_NEWEST_CHECKED
    with zipfile.ZipFile(vllm_wheel("0.34.0")) as z:
        py = [n for n in z.namelist() if n.endswith(".py")]
        assert not any(VLLM_FINALIZE_ENV.encode() in z.read(n) for n in py)
        assert "vllm/v1/worker/gpu_model_runner.py" not in py
        assert "vllm/v1/worker/gpu/model_runner.py" in py
    for version, pin in VLLM_FLASHINFER_PINS.items():
        need(str(version))
        metadata = module_text(str(version), f"vllm-{version}.dist-info/METADATA")
        assert f"Requires-Dist: flashinfer-python=={pin}\n" in metadata


def test_034s_extensible_kv_cache_skips_an_op_its_hash_does_not_see() -> None:
    need("0.33.0")
    need("0.34.0")
    skips = ast.unparse(_function("0.34.0", _WARMUP, "_flashinfer_autotune_skip_ops"))
    assert f"envs.{VLLM_SKIP_OPS_ENV}" in skips
    assert (
        f"enable_extensible_kv_cache:\n        skip_ops.add('{VLLM_EXTENSIBLE_KV_SKIPS}')" in skips
    )
    ignored = ast.unparse(_function("0.34.0", "vllm/config/cache.py", "compile_factors"))
    assert "'enable_extensible_kv_cache'" in ignored and "'block_size'" not in ignored
    assert "enable_extensible_kv_cache" not in module_text("0.33.0", "vllm/config/cache.py")
    assert VLLM_SKIP_OPS_ENV in module_text("0.33.0", "vllm/envs.py")


@needs_vllm
def test_the_prediction_runs_the_workers_block_size_step_and_says_the_hash_depends_on_it(
    vllm_model: Path, tmp_path: Path
) -> None:
    """vLLM hashes block_size, which its worker sets from the attention backends before it
    hashes (update_block_size_for_backend, 0.32-0.34): the prediction runs that step too and
    lists it in depends_on unless --block-size fixes it (real vLLM 0.32 runs the child: the only
    vLLM with a CPU build; test_vllm_predict checks the hash is the worker's)."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(tmp_path)}
    argv = ["--model", str(vllm_model), *TINY_FAST]
    free = predict(VLLM_PYTHON, "0.32.0", argv, env, None)
    assert any("KV-cache block size" in d for d in free.depends_on), free.depends_on
    fixed = predict(VLLM_PYTHON, "0.32.0", [*argv, "--block-size", "16"], env, None)
    assert not any("block size" in d for d in fixed.depends_on), fixed.depends_on


# --- a newcomer's 0.34 command lines, through doctor ----------------------------------------


def _stage_files(hdir: Path, drop: int) -> None:
    """Two pipeline stages' files (-pp 2, tp 1): each stage tunes its own layers, so their
    entry counts differ (stage 1's holds `drop` fewer)."""
    hdir.mkdir(parents=True)
    cf = v1.loads(GEMM_618.read_bytes())
    for rank, skip in (("dp0_rank0", 0), ("dp0_rank1", drop)):
        keys = list(cf.entries)[skip:]
        part = v1.CacheFile(cf.metadata, {k: cf.entries[k] for k in keys}, None, cf.generation)
        (hdir / f"autotune_configs_{rank}.json").write_text(v1.dumps(part))


def _checks(r: Any, prefix: str) -> list[dict[str, Any]]:
    return [f for f in r.json()["findings"] if f["check"].startswith(prefix)]


def test_doctor_judges_pipeline_stage_files_per_stage(run: Any, tmp_path: Path) -> None:
    """With -pp 2 each stage's TP group loads its own file (kernel_warmup.py 0.34:571): two
    stage files of different lengths are fine, not 'all 2 ranks tune again'; the same files
    of a -tp 2 deployment fail vLLM's gate."""
    hdir = tmp_path / "0.6.18" / "90a" / ("c" * 64)
    _stage_files(hdir, drop=3)
    doctor = ["--format", "json", "doctor", hdir, "--vllm-version", "0.34.0", "--", "Qwen/Qwen3-8B"]
    r = run(*doctor, "-pp", "2")
    assert r.code == 0, r.err
    assert _checks(r, "vllm-ranks") == [] and _checks(r, "ranks-divergent") == []
    [f] = _checks(run(*doctor, "-tp", "2"), "vllm-ranks-retune")
    assert "all 2 ranks tune again" in f["message"]
    r = run(*doctor, "-tp", "2", "-pp", "2")  # 2 stages of 2 ranks: each judged alone
    first, second = _checks(r, "vllm-ranks-retune")
    assert (
        first["details"]["ranks"] == ["dp0_rank0", "dp0_rank1"] and not first["details"]["missing"]
    )
    assert "aligns each stage's rank files alone" in first["fix"]
    assert second["details"]["ranks"] == second["details"]["missing"] == ["dp0_rank2", "dp0_rank3"]


def test_doctor_reads_a_034_command_line_with_its_new_flags(run: Any) -> None:
    """`--shuffle-safetensors-files -tp 2` is TP 2: doctor names both rank files."""
    r = run(
        "doctor",
        "--vllm-version",
        "0.34.0",
        "--flashinfer-version",
        "0.7.4",
        "--",
        "Qwen/Qwen3-8B",
        "--shuffle-safetensors-files",
        "-tp",
        "2",
    )
    assert r.code == 0, r.err
    assert "autotune_configs_dp0_rank0.json, autotune_configs_dp0_rank1.json" in r.out


def test_the_layout_model_names_every_releases_files_and_says_when_moe_is_assumed(
    run: Any,
) -> None:
    doctor = ["doctor", "--flashinfer-version", "0.7.4", "--vllm-version"]
    r = run(*doctor, "0.33.0", "--", "Qwen/Qwen3-30B-A3B", "-dp", "2")
    assert "autotune_configs_dp0_rank0.json, autotune_configs_dp1_rank1.json" in r.out
    assert "MoE assumed" in r.out
    r = run(*doctor, "0.31.0", "--", "m", "-tp", "2")
    assert "autotune_configs.json in <dir>/<config hash>/" in r.out


def test_doctor_refuses_the_disable_flag_before_033_as_warm_and_serve_do(run: Any) -> None:
    r = run("doctor", "--vllm-version", "0.32.0", "--", "m", "--disable-flashinfer-autotune")
    assert r.code == 2 and "vLLM 0.32.0 has no --disable-flashinfer-autotune" in r.err
    r = run("doctor", "--vllm-version", "0.33.0", "--", "m", "--disable-flashinfer-autotune")
    assert r.code == 0, r.err


def test_a_readable_config_decides_moe_for_the_layout_model(run: Any, tmp_path: Path) -> None:
    """A model dir's config.json says dense or MoE as vLLM's is_moe reads it: dense -dp 2 on
    0.33/0.34 is FlashInfer's v2 store (each DP rank a world of one), MoE folds DP."""
    dense, moe = tmp_path / "dense", tmp_path / "moe"
    for d, config in ((dense, {"num_hidden_layers": 2}), (moe, {"num_experts": 8})):
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"model_type": "qwen3", **config}))
    doctor = ["doctor", "--flashinfer-version", "0.7.4", "--vllm-version", "0.34.0", "--"]
    r = run(*doctor, dense, "-dp", "2")
    assert "FlashInfer's v2 store" in r.out and "MoE assumed" not in r.out
    r = run(*doctor, moe, "-dp", "2")
    assert "autotune_configs_dp0_rank0.json, autotune_configs_dp1_rank1.json" in r.out
    assert "MoE assumed" not in r.out


def test_doctor_says_which_flashinfer_vllm_034_imports_against_its_pin(run: Any) -> None:
    r = run(
        "--format",
        "json",
        "doctor",
        "--vllm-version",
        "0.34.0",
        "--flashinfer-version",
        "0.7.4",
        "--check",
        "flashinfer-pin",
    )
    [f] = r.json()["findings"]
    assert "vLLM 0.34.0 pins flashinfer-python==0.7.3" in f["message"]
    assert "cannot resolve" in f["message"] and "imports FlashInfer 0.7.4" in f["message"]
    r = run(
        "--format",
        "json",
        "doctor",
        "--vllm-version",
        "0.33.0",
        "--flashinfer-version",
        "0.7.2.post1",
        "--check",
        "flashinfer-pin",
    )
    assert r.json()["findings"] == []


# --- what vLLM tunes, outside its hash: VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS, the extensible KV --


def test_a_warm_under_one_skip_ops_setting_is_no_warm_for_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.33+ does not hash VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS: serve and warm must not take
    a warm that skipped ops for one that tunes them (or back); a warm without it keeps its key,
    so every earlier record stays warm."""
    from fi_cache.engines.vllm.engine import ENGINE

    args = parse_serve_args(["Qwen/Qwen3-8B", "-tp", "2"])
    monkeypatch.delenv("VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS", raising=False)
    plain = ENGINE.warm_key(args, "fused")
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "f.json").write_text("{}")
    ns = Namespace(Fingerprint.from_metadata(H200_618, "90a"), "fused")
    rec = CacheFileRecord("vllm/f.json", 1, 2)
    m = Manifest.new(ns).with_warm(WarmRecord(0, 1, "0.34.0", list(args.argv), plain, [rec], False))
    assert plain == args.key and ENGINE.is_warm(tmp_path, m, args, "fused")
    keys = set()
    for value in ("fp4_gemm", " fp4_gemm ,", "", "fp4_gemm,trtllm_batch_decode_mla"):
        monkeypatch.setenv("VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS", value)
        assert not ENGINE.is_warm(tmp_path, m, args, "fused")
        keys.add(ENGINE.warm_key(args, "fused"))
    assert len(keys) == 3  # " fp4_gemm ," is vLLM's "fp4_gemm"


def _scope_findings(tmp_path: Path, argv: list[str], environ: dict[str, str]) -> list[Any]:
    """doctor's tuning-scope over a namespace warmed (plain) for `Qwen/Qwen3-8B`."""
    path = tmp_path / GEMM_618.name
    path.write_bytes(GEMM_618.read_bytes())
    cache = read(classify_file(path))
    ns = Namespace(Fingerprint.from_metadata(H200_618, "90a"), "fused")
    warmed = parse_serve_args(["Qwen/Qwen3-8B"])
    m = Manifest.new(ns).with_warm(
        WarmRecord(0, 1, "0.34.0", list(warmed.argv), warmed.key, [], False)
    )
    view = CacheView(cache, tmp_path, "fused", m)
    target = Target(Fingerprint.from_metadata(H200_618, "90a"), "0.34.0")
    inputs = Inputs(target, (view,), serve=parse_serve_args(argv), environ=environ)
    return doctor.run(inputs, ["tuning-scope"])


def test_doctor_says_when_a_start_tunes_other_ops_than_the_namespaces_warm(tmp_path: Path) -> None:
    [f] = _scope_findings(tmp_path, ["Qwen/Qwen3-8B"], {"VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS": "x"})
    assert f.severity == "warning"
    assert "this start runs with VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS=x" in f.message
    assert "extensible KV cache on (trtllm_batch_decode_mla not tuned)" in f.message
    assert "skips its tuning sweep" in f.message
    [f] = _scope_findings(tmp_path, ["Qwen/Qwen3-8B", "--no-enable-extensible-kv-cache"], {})
    assert f.severity == "warning" and "extensible KV cache off (MLA decode tuned)" in f.message
    assert _scope_findings(tmp_path, ["Qwen/Qwen3-8B"], {}) == []  # the warm's own setting


def _entry_counts(rig: Any) -> dict[str, int]:
    [ns] = rig.namespaces()
    return {
        p.name: len(json.loads(p.read_text())) - 1  # less _metadata
        for p in sorted(ns.rglob("autotune_configs_dp*_rank*.json"))
    }


@pytest.mark.parametrize("layout, aligned", [(["-pp", "2"], False), (["-tp", "2"], True)])
def test_warm_aligns_a_tune_group_never_two_pipeline_stages(
    tmp_path: Path, layout: list[str], aligned: bool
) -> None:
    """The stand-in vLLM writes two rank files of GEMM entries, rank 1 short of rank 0's first
    entry. With -tp 2
    they are one tune group and warm gives both the union; with -pp 2 they are two stages'
    files, each its own group (kernel_warmup.py 0.34:571): left as each stage tuned them."""
    from tests.vllm_rig import MODEL, make_rig, vllm_dist

    rig = make_rig(tmp_path)
    dist = {
        **vllm_dist(rig, "0.34.0"),
        "FAKE_VLLM_RANKS": "2",
        "FAKE_VLLM_CACHE_SOURCE": str(GEMM_618),
    }
    done = rig.run("warm", "--", MODEL, *layout, **dist)
    assert done.returncode == 0, done.stderr
    counts = list(_entry_counts(rig).values())
    assert len(counts) == 2 and (counts[0] == counts[1]) is aligned, counts
    assert ("aligned the rank files" in done.stderr) is aligned


def test_serve_reads_tp_after_a_034_valueless_flag(tmp_path: Path) -> None:
    """`serve -- M --shuffle-safetensors-files -tp 2` is two ranks: serve looks for this node's
    rank files as for any `-tp 2` (read as one rank before, it skipped that). The stand-in vLLM
    cannot answer where its files go, so serve says it cannot tell and starts."""
    from tests.vllm_rig import MODEL, make_rig, vllm_dist

    rig = make_rig(tmp_path)
    dist = {**vllm_dist(rig, "0.34.0"), "FAKE_VLLM_RANKS": "2"}
    argv = [MODEL, "--shuffle-safetensors-files", "-tp", "2"]
    assert rig.run("warm", "--", *argv, **dist).returncode == 0
    served = rig.run("serve", "--", *argv, FAKE_VLLM_MODE="exit-now", **dist)
    assert served.returncode == 0, served.stderr
    assert "cannot tell whether this node's rank files are all here" in served.stderr
    assert rig.starts()[-1]["argv"][-len(argv) :] == argv  # handed over as given
