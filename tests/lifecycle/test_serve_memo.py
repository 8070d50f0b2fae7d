"""serve's memo (fi_cache/lifecycle/serve_memo.py), in real processes: a repeated serve replays
the one before it, exactly; any change to what that serve read runs the full serve again, whose
checks then speak; a memo that is not the user's own is never run."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fi_cache.lifecycle import serve_memo
from fi_cache.lifecycle.serve_memo import record, replay, stamps
from fi_cache.store import in_use
from fi_cache.store.paths import STORE_ENV

ROOT = Path(__file__).resolve().parents[2]
FAKE = ROOT / "tests" / "fake_vllm.py"
FIXTURE = ROOT / "tests" / "fixtures" / "flashinfer" / "fi-0.6.18-moe-fused.json"
MODEL = "Qwen/Qwen3-30B-A3B"
REPLAYED = "serve memo: replayed"
_SCRUB = ("FI_CACHE_PYTHON", STORE_ENV, "FI_CACHE_VLLM", "VLLM_FLASHINFER_MOE_FUSED_FINALIZE")


class Rig:
    """A store whose namespace a stand-in vLLM warmed, and `fi-cache serve` run against it."""

    def __init__(self, root: Path) -> None:
        self.root, self.store, self.record = root, root / "store", root / "record"
        self.vllm = root / "bin" / "vllm"
        path = os.environ.get("PATH", "")
        self.env = {k: v for k, v in os.environ.items() if k not in _SCRUB and k != "_"}
        self.env.update(
            FI_CACHE_VLLM=str(self.vllm),
            FAKE_VLLM_CACHE_SOURCE=str(FIXTURE),
            FAKE_VLLM_RECORD=str(self.record),
            PATH=path,
            FI_CACHE_SERVE_MEMO="explain",
        )

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run_as(("--store", str(self.store), *args), **env)

    def run_as(self, args: tuple[str, ...], **env: str) -> subprocess.CompletedProcess[str]:
        """fi-cache with exactly these arguments (its --store included)."""
        cmd = [sys.executable, "-m", "fi_cache", *args]
        return subprocess.run(
            cmd, env={**self.env, **env}, cwd=self.root, capture_output=True, text=True, timeout=60
        )

    def serve(self, *vllm_args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return self.run("serve", "--", MODEL, *vllm_args, FAKE_VLLM_MODE="exit-now", **env)

    def starts(self) -> list[dict[str, object]]:
        lines = (self.record / "starts.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def settle(self) -> None:
        """Every file and dir here ten seconds old: the memo keeps only files that are settled
        (a real store's were written minutes before)."""
        then = time.time() - 10
        for path in [self.root, *self.root.rglob("*")]:
            os.utime(path, (then, then), follow_symlinks=False)

    def cache_file(self) -> Path:
        [path] = self.store.glob("namespaces/**/autotune_configs.json")
        return path


def _said(p: subprocess.CompletedProcess[str]) -> list[str]:
    """What fi-cache printed: without the memo's own explanation and the stand-in's log."""
    return [
        line
        for line in (p.stderr + p.stdout).splitlines()
        if "serve memo:" not in line and "fake vLLM" not in line
    ]


@pytest.fixture(scope="module")
def warmed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rig = Rig(tmp_path_factory.mktemp("warmed"))
    rig.vllm.parent.mkdir(parents=True)
    rig.vllm.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    rig.vllm.chmod(0o755)
    rig.record.mkdir()
    p = rig.run("warm", "--", MODEL)
    assert p.returncode == 0, p.stderr
    return rig.root


@pytest.fixture
def rig(warmed: Path, tmp_path: Path) -> Iterator[Rig]:
    """A copy of the warmed store, served once (its memo kept)."""
    root = tmp_path / "rig"
    shutil.copytree(warmed, root, symlinks=True)
    r = Rig(root)
    (r.record / "starts.jsonl").unlink(missing_ok=True)
    r.vllm.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    r.settle()
    first = r.serve()
    assert first.returncode == 0, first.stderr
    assert "serve memo: kept" in first.stderr, first.stderr
    yield r


def test_a_repeated_serve_replays_the_first_exactly(rig: Rig) -> None:
    first_err = rig.serve()  # the rig's serve was the first; this one and the next replay
    again = rig.serve()
    assert REPLAYED in first_err.stderr and REPLAYED in again.stderr
    full = rig.serve(FI_CACHE_SERVE_MEMO="0")
    assert REPLAYED not in full.stderr
    assert _said(again) == _said(full) and len(_said(full)) == 1
    starts = rig.starts()
    assert len(starts) == 4
    # vLLM got the same command line and the same environment each time (but the memo's switch)
    seen = {
        (json.dumps(s["argv"]), json.dumps({**s["env"], "FI_CACHE_SERVE_MEMO": ""}))  # type: ignore[dict-item]
        for s in starts
    }
    assert len(seen) == 1 and "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR" in seen.pop()[1]


def test_a_replayed_serve_is_a_use_that_prune_sees(rig: Rig) -> None:
    [ns] = rig.store.glob("namespaces/*/*/*/*-*")
    old = time.time() - 3600
    os.utime(ns / in_use.IN_USE_NAME, (old, old))
    assert REPLAYED in rig.serve().stderr
    assert time.time() - (in_use.served_at(ns) or 0) < 60


def test_the_json_document_is_replayed_and_the_engine_log_goes_to_stderr(rig: Rig) -> None:
    first = rig.run("--format", "json", "serve", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    again = rig.run("--format", "json", "serve", "--", MODEL, FAKE_VLLM_MODE="exit-now")
    assert "serve memo: kept" in first.stderr and REPLAYED in again.stderr
    assert json.loads(again.stdout) == json.loads(first.stdout)
    assert "fake vLLM exiting at once" in again.stderr


@pytest.mark.parametrize(
    "change",
    ["engine argument", "environment", "cache file rewritten", "file added", "launcher"],
)
def test_any_change_runs_the_full_serve(rig: Rig, change: str) -> None:
    assert REPLAYED in rig.serve().stderr  # unchanged, it would be replayed
    extra: tuple[str, ...] = ()
    env: dict[str, str] = {}
    if change == "engine argument":
        extra = ("--port", "8001")
    elif change == "environment":
        env = {"SOME_SETTING": "1"}
    elif change == "cache file rewritten":
        data = json.loads(rig.cache_file().read_text())
        rig.cache_file().write_text(json.dumps(data, indent=1))
    elif change == "file added":
        (rig.cache_file().parent / "notes.txt").write_text("x")
    else:
        rig.vllm.write_text(rig.vllm.read_text() + "# another vLLM\n")
    p = rig.serve(*extra, **env)
    assert p.returncode == 0, p.stderr
    assert REPLAYED not in p.stderr


def test_a_cache_broken_after_the_memo_stops_the_start(rig: Rig) -> None:
    """The memo never hides what the pre-flight would say: the full serve runs and refuses."""
    rig.cache_file().write_text("{ not json")
    p = rig.serve()
    assert REPLAYED not in p.stderr
    assert p.returncode != 0 and "pre-flight found" in p.stderr
    assert len(rig.starts()) == 1  # only the rig's first serve reached vLLM


def test_a_model_dir_gone_since_runs_the_full_serve_which_refuses(rig: Rig) -> None:
    """A local model on a volume not mounted yet at a restart: a stat alone decides that."""
    model = rig.root / "models" / "qwen3"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    rig.settle()
    for said in ("serve memo: kept", REPLAYED):
        p = rig.run("serve", "--no-warm", "--", str(model), FAKE_VLLM_MODE="exit-now")
        assert said in p.stderr, p.stderr
    shutil.rmtree(model)
    p = rig.run("serve", "--no-warm", "--", str(model), FAKE_VLLM_MODE="exit-now")
    assert p.returncode == 2 and "no such model directory" in p.stderr
    assert REPLAYED not in p.stderr


def test_a_store_link_pointed_at_a_copy_serves_the_copy(rig: Rig) -> None:
    """--store through a link; the store copied (memo and all, times kept) and the link moved."""
    link = rig.root / "store-link"
    link.symlink_to(rig.store)
    args = ("--store", str(link), "serve", "--", MODEL)
    rig.settle()
    for said in ("serve memo: kept", REPLAYED):
        p = rig.run_as(args, FAKE_VLLM_MODE="exit-now")
        assert said in p.stderr, p.stderr
    copy = rig.root / "store-copy"
    shutil.copytree(rig.store, copy, symlinks=True)  # copy2: times kept
    link.unlink()
    link.symlink_to(copy)
    p = rig.run_as(args, FAKE_VLLM_MODE="exit-now")
    assert REPLAYED not in p.stderr
    assert str(copy) in str(rig.starts()[-1]["env"])


def test_a_replay_whose_engine_cannot_start_says_so_once(rig: Rig) -> None:
    """As the full serve: its output, then one line and exit 2; the memo goes."""
    rig.vllm.write_text("not a program\n")  # executable, but no #!: exec fails
    rig.settle()
    first = rig.serve()
    assert first.returncode == 2 and "serve memo: kept" in first.stderr, first.stderr
    again = rig.serve()
    assert REPLAYED in again.stderr and again.returncode == 2
    assert _said(again) == _said(first) and again.stderr.count("cannot run vLLM") == 1
    assert not list(
        _memo_dir(rig).glob("*" + serve_memo.MEMO_SUFFIX)
    )  # the next serve runs in full


def test_a_running_preload_daemon_runs_the_full_serve(rig: Rig) -> None:
    """No stamp shows a `vllm preload` started since: the processes are looked at each time."""
    sleeper = subprocess.Popen(  # its command line reads `... vllm preload`
        [sys.executable, "-c", "import time; time.sleep(60)", "/opt/venv/bin/vllm", "preload"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert REPLAYED not in rig.serve().stderr
    finally:
        sleeper.kill()
        sleeper.wait()
    assert REPLAYED in rig.serve().stderr


@pytest.mark.parametrize(
    "bad",
    [
        {"command": ["", "serve"]},
        {"command": "vllm serve"},
        {"set": {"A=B": "1"}},
        {"set": {"A": "x\0y"}},
        {"ns_dir": "/tmp/x\0y"},
        {"ns_dir": "/tmp/elsewhere"},  # not one of the store's namespaces
        {"ns_dir": "STORE/namespaces/../.."},
        {"inputs": [["stat", "/x\0y", None]]},
        {"recorded": time.time() + 3600},  # the clock stepped back since
    ],
)
def test_a_memo_with_values_this_fi_cache_never_writes_runs_the_full_serve(
    rig: Rig, bad: dict[str, object]
) -> None:
    memo = _memo(rig)
    store = str(rig.store)
    bad = {k: v.replace("STORE", store) if isinstance(v, str) else v for k, v in bad.items()}
    memo.write_bytes(marshal.dumps({**marshal.loads(memo.read_bytes()), **bad}))
    p = rig.serve()
    assert p.returncode == 0 and REPLAYED not in p.stderr and "Traceback" not in p.stderr


def test_a_memo_holds_no_longer_than_what_it_read(rig: Rig) -> None:
    """A FlashInfer probe failure is kept an hour (environment.detect), then asked again: a
    memo that read it expires with it."""
    memo = _memo(rig)
    doc = marshal.loads(memo.read_bytes())
    doc["expires"] = time.time() - 1
    memo.write_bytes(marshal.dumps(doc))
    assert REPLAYED not in rig.serve().stderr
    rec = record.Recorder(["serve", "m"])
    rec.hook(serve_memo.EXPIRES_EVENT, (200.0,))
    rec.hook(serve_memo.EXPIRES_EVENT, (100.0,))
    assert rec.expires == 100.0


def test_memo_off_neither_reads_nor_keeps_one(rig: Rig) -> None:
    p = rig.serve(FI_CACHE_SERVE_MEMO="0")
    assert "serve memo" not in p.stderr and p.returncode == 0


def _memo_dir(rig: Rig) -> Path:
    return rig.store / ".fi-cache" / "serve" / str(os.getuid())


def _memo(rig: Rig) -> Path:
    [path] = _memo_dir(rig).glob("*" + serve_memo.MEMO_SUFFIX)
    return path


@pytest.mark.parametrize("how", ["file writable by others", "dir open to others", "a link"])
def test_a_memo_that_is_not_the_users_alone_is_never_run(rig: Rig, how: str) -> None:
    memo = _memo(rig)
    doc = marshal.loads(memo.read_bytes())
    planted = rig.root / "planted"
    doc["command"] = ["/bin/sh", "-c", f"touch {planted}"]
    memo.write_bytes(marshal.dumps(doc))
    if how == "file writable by others":
        memo.chmod(0o666)
    elif how == "dir open to others":
        memo.parent.chmod(0o755)
    else:
        target = rig.root / "elsewhere.json"
        memo.rename(target)
        memo.symlink_to(target)
    p = rig.serve()
    assert REPLAYED not in p.stderr and p.returncode == 0
    assert not planted.exists()


def test_a_serve_with_findings_keeps_no_memo(rig: Rig) -> None:
    """A serve that goes on past its pre-flight's errors (--force) says them every time."""
    rig.cache_file().write_text("{ not json")
    rig.settle()
    for _ in range(2):
        p = rig.run("serve", "--force", "--", MODEL, FAKE_VLLM_MODE="exit-now")
        assert "not kept: the pre-flight found something" in p.stderr, p.stderr
        assert REPLAYED not in p.stderr and "corrupt" in p.stderr


def test_only_the_newest_memos_are_kept(rig: Rig) -> None:
    """One memo per command line and environment (a pod's name differs at every start): the
    oldest go."""
    old = _memo(rig)
    stale = [
        old.with_name(f"{i:032x}{serve_memo.MEMO_SUFFIX}") for i in range(serve_memo.KEPT_MEMOS)
    ]
    for i, path in enumerate(stale):
        path.write_bytes(b"")
        os.utime(path, (1000 + i, 1000 + i))
    rig.serve("--port", "8123")  # another command line: a memo of its own
    left = set(old.parent.glob("*" + serve_memo.MEMO_SUFFIX))
    assert len(left) == serve_memo.KEPT_MEMOS and old in left and stale[0] not in left


# --- the parts, without processes --------------------------------------------------------------


def test_the_key_ignores_what_no_serve_reads(tmp_path: Path) -> None:
    env = {"A": "1", "_": "/usr/bin/time"}
    base = serve_memo.key(["serve", "m"], env, "/w")
    assert (
        serve_memo.key(["serve", "m"], {**env, "_": "/x", "FI_CACHE_SERVE_MEMO": "explain"}, "/w")
        == base
    )
    assert serve_memo.key(["serve", "m"], {**env, "A": "2"}, "/w") != base
    assert serve_memo.key(["serve", "m"], env, "/v") != base
    assert serve_memo.key(["serve", "n"], env, "/w") != base


def test_the_store_is_read_as_the_cli_reads_it(tmp_path: Path) -> None:
    assert serve_memo.store_of(["--store", "/s", "serve"], {}) == "/s"
    assert serve_memo.store_of(["--store=/s", "serve"], {STORE_ENV: "/e"}) == "/s"
    assert serve_memo.store_of(["serve", "--", "--store", "/x"], {STORE_ENV: "/e"}) == "/e"


def test_recording_judges_writes_and_children(tmp_path: Path) -> None:
    rec = record.Recorder(["serve", "m"])
    ns = tmp_path / "ns"
    rec.hook("open", (str(ns / ".fi-cache.inuse"), None, os.O_CREAT | os.O_RDWR))
    rec.hook("open", (str(ns / ".fi-cache-abc.tmp"), None, os.O_CREAT | os.O_WRONLY))
    rec.hook("open", (str(ns / "manifest.json"), "r", 0))
    assert rec.not_kept == [] and ("stat", str(ns / "manifest.json")) in rec.seen
    rec.hook("os.rename", (str(ns / ".fi-cache-abc.tmp"), str(ns / "manifest.json"), -1, -1))
    rec.hook("subprocess.Popen", ("nvidia-smi", ["nvidia-smi"], None, None))
    assert rec.not_kept == [
        f"os.rename of {ns / 'manifest.json'}",
        "ran a child (subprocess.Popen)",
    ]


def test_store_dirs_are_stamped_by_their_entries_and_bookkeeping_is_not_an_input(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    cache = store / "ns" / "vllm"
    cache.mkdir(parents=True)
    (cache / "autotune_configs.json").write_text("{}")
    rec = record.Recorder(["--store", str(store), "serve", "m"])
    rec.hook("os.listdir", (str(cache),))
    rec.hook("open", (str(cache / "autotune_configs.json"), "r", 0))
    rec.hook("open", (str(store / "ns" / ".fi-cache.inuse"), None, os.O_CREAT | os.O_RDWR))
    kinds = {p: k for k, p, _ in rec.inputs()}
    assert kinds[str(cache)] == "listing" and kinds[str(cache / "autotune_configs.json")] == "stat"
    assert str(store / "ns" / ".fi-cache.inuse") not in kinds
    before = stamps.stamp("listing", str(cache))
    (cache / ".fi-cache.inuse").write_text("")  # serve's in-use mark: not a change
    assert stamps.stamp("listing", str(cache)) == before
    (cache / "rank1.json").write_text("{}")
    assert stamps.stamp("listing", str(cache)) != before


def test_an_input_that_changes_while_the_serve_reads_it_keeps_no_memo(tmp_path: Path) -> None:
    """Stamped when first read: a file replaced between the pre-flight and the memo's stamps
    (with its old mtime kept, as cp -a does) is not trusted to a stamp taken after."""
    cache = tmp_path / "autotune_configs.json"
    cache.write_text("{}")
    rec = record.Recorder(["serve", "m"])
    rec.hook("open", (str(cache), "r", 0))
    st = cache.stat()
    cache.write_text('{"x": 1}')
    os.utime(cache, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ValueError, match="changed while this serve read it"):
        rec.inputs()
    store = tmp_path / "store"
    (store / "vllm").mkdir(parents=True)
    rec = record.Recorder(["--store", str(store), "serve", "m"])
    rec.hook("os.scandir", (str(store / "vllm"),))
    (store / "vllm" / "autotune_configs_dp0_rank1.json").write_text("{")  # a rank file lands
    with pytest.raises(ValueError, match="changed while this serve read it"):
        rec.inputs()


def test_a_compiled_modules_source_is_an_input(tmp_path: Path) -> None:
    """Python opens only a current .pyc, and stats its .py: an edited .py is a change."""
    (tmp_path / "__pycache__").mkdir()
    pyc = tmp_path / "__pycache__" / "mod.cpython-311.pyc"
    pyc.write_bytes(b"")
    (tmp_path / "mod.py").write_text("")
    rec = record.Recorder(["serve", "m"])
    rec.hook("open", (str(pyc), "r", 0))
    assert ("stat", str(tmp_path / "mod.py")) in {(k, p) for k, p, _ in rec.inputs()}


def test_devices_are_no_inputs_but_dev_shm_is_a_filesystem(tmp_path: Path) -> None:
    rec = record.Recorder(["serve", "m"])
    rec.hook("open", ("/dev/null", "r", 0))
    rec.hook("open", ("/dev/shm/fi-cache/manifest.json", "r", 0))
    seen = {p for _k, p in rec.seen}
    assert "/dev/null" not in seen and "/dev/shm/fi-cache/manifest.json" in seen


def test_what_os_access_answers_is_the_stamp_of_an_access_check(tmp_path: Path) -> None:
    """An immutable flag or an ACL changes os.access's answer without a mode change."""
    value = stamps.stamp("access", str(tmp_path))
    assert value[:3] == [os.access(tmp_path, m) for m in (os.R_OK, os.W_OK, os.X_OK)]
    assert stamps.stamp("access", str(tmp_path / "missing"))[:3] == [False] * 3


def test_a_replay_looks_for_the_engines_own_processes_not_for_a_word(tmp_path: Path) -> None:
    """A shell's `sh -c "fi-cache serve --engine sglang ..."` is no SGLang server; SGLang's
    own processes and `python -m sglang.launch_server` are (engines/sglang/live.is_sglang)."""
    words, prefixes = record.watched("sglang")

    def sees(*argv: str) -> bool:
        p = subprocess.Popen(
            [sys.executable, "-c", "import sys, time; time.sleep(30)", *argv],
            stdout=subprocess.DEVNULL,
        )
        try:
            deadline = time.time() + 5
            while time.time() < deadline and not Path(f"/proc/{p.pid}/cmdline").read_bytes():
                time.sleep(0.01)
            return replay.running(words, prefixes)
        finally:
            p.kill()
            p.wait()

    assert not replay.running(words, prefixes)
    assert not sees("fi-cache serve --engine sglang --model-path m")
    assert sees("-m", "sglang.launch_server", "--model-path", "m")
    assert sees("/venv/bin/sglang", "serve", "--model-path", "m")


def test_who_runs_the_serve_is_in_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another supplementary group may write where this one cannot: another memo."""
    base = serve_memo.key(["serve", "m"], {}, "/w")
    monkeypatch.setattr(os, "getgroups", lambda: [12345])
    assert serve_memo.key(["serve", "m"], {}, "/w") != base


def test_every_stat_only_input_is_raised_under_the_memos_event_name() -> None:
    """Code below lifecycle cannot import serve_memo: it spells the event itself."""
    import re

    package = Path(serve_memo.__file__).resolve().parents[2]
    raised = {
        m
        for path in package.rglob("*.py")
        for m in re.findall(r"sys\.audit\(\"([^\"]+)\"", path.read_text())
    }
    assert raised == {serve_memo.STAT_EVENT, serve_memo.EXPIRES_EVENT}
