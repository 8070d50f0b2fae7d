"""push / pull: round trips through file://, memory:// and real S3 over HTTP on loopback.

S3 is moto's standalone server on 127.0.0.1 with s3fs as the client, pointed there by
`FSSPEC_S3_ENDPOINT_URL` (fsspec's own convention), exactly as a user points fi-cache at MinIO.
Two machines are simulated by patching `fi_cache.environment.detect`.
"""

from __future__ import annotations

import importlib
import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fsspec
import fsspec.config
import pytest

from fi_cache import environment
from fi_cache.cli import cli
from fi_cache.cli.push_pull import COMMANDS, LiveProgress
from fi_cache.environment import Environment, VllmInfo
from fi_cache.fleet import transfer
from fi_cache.fleet.bundle import remote_key
from fi_cache.model.fingerprint import Fingerprint
from fi_cache.store import locks
from fi_cache.store import manifest as manifests
from fi_cache.store.files import TMP_PREFIX
from fi_cache.store.manifest import Manifest
from fi_cache.store.namespace import Namespace
from fi_cache.store.paths import state_dir
from tests.conftest import GEMM_618, MOE_618_FUSED, MOE_618_UNFUSED, ROOT, Result, no_hang
from tests.fleet.test_bundle import CORRUPTIONS, corrupt_cache

for _command in COMMANDS:
    cli.add_command(_command)

REPO = ROOT
# The environment the fixture files were written in (their `_metadata`): import checks the caches.
H200 = Fingerprint.from_metadata(json.loads(MOE_618_FUSED.read_text())["_metadata"], "90a")
B200 = H200.replace(gpu="NVIDIA B200", arch="100a")
Run = Callable[..., Result]


# --- helpers ------------------------------------------------------------------------------------


def _as_machine(monkeypatch: pytest.MonkeyPatch, fp: Fingerprint) -> None:
    env = Environment(fp, (), VllmInfo("0.11.0", None, None), "2.8.0")
    monkeypatch.setattr(environment, "detect", lambda *a, **k: env)


def _warm(store: Path, fp: Fingerprint) -> list[Path]:
    """Both finalize namespaces of `fp`, each with a manifest and real FlashInfer files."""
    dirs = []
    for finalize, files in (
        ("fused", [MOE_618_FUSED, GEMM_618]),
        ("unfused", [MOE_618_UNFUSED]),
    ):
        ns = Namespace(fp, finalize)  # type: ignore[arg-type]
        d = ns.path(store)
        (d / "vllm").mkdir(parents=True)  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, as warm sets it
        for i, src in enumerate(files):
            shutil.copy(src, d / "vllm" / f"autotune_configs_dp0_rank{i}.json")
        manifests.save(d, Manifest.new(ns))
        dirs.append(d)
    return dirs


def _namespace_tree(store: Path) -> dict[str, bytes]:
    root = store / "namespaces"
    skip = {locks.LOCK_NAME, locks.HOLDER_NAME}
    return {
        p.relative_to(store).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip
    }


def _files(store: Path) -> list[Path]:
    return [p for p in store.rglob("*") if p.is_file()] if store.exists() else []


def _local_remote(url: str) -> tuple[Any, str]:
    fs, base = fsspec.core.url_to_fs(url)
    return fs, base.rstrip("/")


def _flip_byte(url: str, key: str, offset: int = 100) -> None:
    fs, base = _local_remote(url)
    data = bytearray(fs.cat_file(f"{base}/{key}"))
    data[offset] ^= 0xFF
    fs.pipe_file(f"{base}/{key}", bytes(data))


@pytest.fixture(params=["file", "path", "memory"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty remote: a file:// URL, a plain path, or an in-memory filesystem."""
    if request.param == "memory":
        root = f"memory://fi-cache-test-{uuid.uuid4().hex}/fleet"
        yield root
        fs, base = _local_remote(root)
        if fs.exists(base):
            fs.rm(base, recursive=True)
        return
    remote = tmp_path / "remote"
    yield remote.as_uri() if request.param == "file" else str(remote)


@pytest.fixture
def store_b(tmp_path: Path) -> Path:
    return tmp_path / "store-b"


def _pushed(run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, url: str) -> dict[str, Any]:
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    result = run("--format", "json", "push", url)
    assert result.code == 0, result.err
    return result.json()


# --- file:// and memory:// round trips ----------------------------------------------------------


def test_push_then_pull_into_an_empty_store_copies_every_namespace(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str
) -> None:
    pushed = _pushed(run, monkeypatch, store, url)
    key = remote_key(H200)
    assert pushed["key"] == key and pushed["url"].endswith(f"/{key}")
    assert len(pushed["namespaces"]) == 2 and pushed["files"] == 5
    fs, base = _local_remote(url)
    assert sorted(fs.find(base)) == [f"{base}/{key}", f"{base}/{key}.json"]
    sidecar = json.loads(fs.cat_file(f"{base}/{key}.json"))
    assert sidecar["sha256"] == pushed["sha256"] and sidecar["size"] == pushed["bundle_size"]
    assert sidecar["fingerprint"]["gpu"] == "NVIDIA H200"

    pulled = run("--store", str(store_b), "--format", "json", "pull", url)
    assert pulled.code == 0, pulled.err
    assert pulled.json()["namespaces"] == pushed["namespaces"]
    assert pulled.json()["sha256"] == pushed["sha256"]
    assert _namespace_tree(store_b) == _namespace_tree(store)
    assert not list(state_dir(store_b).glob(f"{TMP_PREFIX}*"))  # temp bundle removed


def test_human_output_names_the_remote_and_the_namespaces(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, tmp_path: Path
) -> None:
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    remote = tmp_path / "remote"
    pushed = run("push", str(remote))
    assert pushed.code == 0 and "pushed 2 namespace(s), 5 files" in pushed.out
    assert pushed.err == ""  # not a terminal: no progress line
    pulled = run("--store", str(store_b), "pull", remote.as_uri())
    assert pulled.code == 0 and "pulled 2 namespace(s)" in pulled.out
    assert "namespaces/0.6.18/90a/nvidia-h200/fused-" in pulled.out


def test_push_again_replaces_the_remote_bundle_atomically(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    first = _pushed(run, monkeypatch, store, str(remote))
    shutil.copy(
        GEMM_618, store / first["namespaces"][1] / "vllm" / "autotune_configs_dp0_rank7.json"
    )
    second = run("--format", "json", "push", str(remote)).json()
    assert second["sha256"] != first["sha256"] and second["files"] == first["files"] + 1
    assert not [p for p in remote.rglob("*") if p.name.endswith(".partial")]
    assert run("--store", str(store_b), "pull", str(remote)).code == 0
    assert _namespace_tree(store_b) == _namespace_tree(store)


def test_pull_on_another_machine_names_the_missing_key_and_what_is_there(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str
) -> None:
    _pushed(run, monkeypatch, store, url)
    _as_machine(monkeypatch, B200)
    result = run("--store", str(store_b), "pull", url)
    assert result.code == 2 and result.out == ""
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert "no bundle for this machine (FlashInfer 0.6.18, arch 100a, GPU NVIDIA B200)" in (
        result.err
    )
    assert remote_key(B200) in result.err and remote_key(H200) in result.err
    assert _files(store_b) == []


def test_pull_from_an_empty_remote_says_so(
    run: Run, monkeypatch: pytest.MonkeyPatch, store_b: Path, tmp_path: Path
) -> None:
    _as_machine(monkeypatch, H200)
    result = run("--store", str(store_b), "pull", str(tmp_path / "nothing-here"))
    assert result.code == 2 and "holds no bundles" in result.err


def test_another_machine_can_pull_a_named_key_only_with_force(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str
) -> None:
    _pushed(run, monkeypatch, store, url)
    _as_machine(monkeypatch, B200)
    refused = run("--store", str(store_b), "pull", url, "--key", remote_key(H200))
    assert refused.code == 2 and "bundle is for another environment" in refused.err
    assert refused.err.count("\n") == 1 and remote_key(H200) in refused.err
    assert not (store_b / "namespaces").exists()
    forced = run("--store", str(store_b), "pull", url, "--key", remote_key(H200), "--force")
    assert forced.code == 0, forced.err
    assert _namespace_tree(store_b) == _namespace_tree(store)


@pytest.mark.parametrize("key", ["../x.tar.gz", "a/../../b.tar.gz", "/etc/passwd", "a/b.json"])
def test_a_key_outside_the_url_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, store_b: Path, tmp_path: Path, key: str
) -> None:
    _as_machine(monkeypatch, H200)
    result = run("--store", str(store_b), "pull", str(tmp_path), "--key", key)
    assert result.code == 2 and "is not a bundle key" in result.err


# --- tampering: pull refuses and writes nothing -------------------------------------------------


def test_a_flipped_byte_in_the_remote_bundle_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str
) -> None:
    _pushed(run, monkeypatch, store, url)
    _flip_byte(url, remote_key(H200))
    result = run("--store", str(store_b), "pull", url)
    assert result.code == 2 and "does not match its sidecar's sha256" in result.err
    assert result.err.count("\n") == 1
    assert _files(store_b) == []


def _edit_sidecar(url: str, edit: Callable[[dict[str, Any]], object]) -> None:
    fs, base = _local_remote(url)
    path = f"{base}/{remote_key(H200)}.json"
    data = json.loads(fs.cat_file(path))
    edit(data)
    fs.pipe_file(path, json.dumps(data).encode())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(sha256="0" * 64), "does not match its sidecar's sha256"),
        (lambda d: d.update(size=d["size"] + 1), "its sidecar says"),
        (lambda d: d.update(sha256="not-hex"), "sidecar does not describe this bundle"),
        (lambda d: d.update(key="other/key.tar.gz"), "sidecar does not describe this bundle"),
        (lambda d: d.pop("sha256"), "malformed sidecar"),
        (lambda d: d.update(format="something-else"), "malformed sidecar"),
    ],
)
def test_a_tampered_sidecar_is_refused(
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    store_b: Path,
    url: str,
    edit: Callable[[dict[str, Any]], object],
    message: str,
) -> None:
    _pushed(run, monkeypatch, store, url)
    _edit_sidecar(url, edit)
    result = run("--store", str(store_b), "pull", url)
    assert result.code == 2 and message in result.err, result.err
    assert _files(store_b) == []


def test_a_sidecar_that_is_not_json_or_missing_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str
) -> None:
    _pushed(run, monkeypatch, store, url)
    fs, base = _local_remote(url)
    fs.pipe_file(f"{base}/{remote_key(H200)}.json", b"{not json")
    assert "malformed sidecar" in run("--store", str(store_b), "pull", url).err
    fs.rm_file(f"{base}/{remote_key(H200)}.json")
    result = run("--store", str(store_b), "pull", url)
    assert result.code == 2 and "has no .json sidecar" in result.err
    assert _files(store_b) == []


@pytest.mark.parametrize("what", ["sidecar", "bundle"])
@pytest.mark.parametrize("kind", ["fifo", "link-to-/dev/zero"])
def test_a_fifo_or_endless_device_on_a_file_remote_is_refused_at_once(
    run: Run,
    monkeypatch: pytest.MonkeyPatch,
    store: Path,
    store_b: Path,
    tmp_path: Path,
    what: str,
    kind: str,
) -> None:
    url = (tmp_path / "remote").as_uri()
    _pushed(run, monkeypatch, store, url)
    path = tmp_path / "remote" / (remote_key(H200) + (".json" if what == "sidecar" else ""))
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    with no_hang():
        result = run("--store", str(store_b), "pull", url)
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "is not a regular file" in result.err and str(path.name) in result.err
    assert _files(store_b) == []


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_pushed_cache_flashinfer_cannot_load_is_refused_by_pull(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str, how: str
) -> None:
    """Another fleet member's bad file on the bucket never lands here (verify's rules). This
    fi-cache will not push it (export judges caches as import does): the bucket's bundle is
    one an older fi-cache pushed, which judged nothing."""
    _as_machine(monkeypatch, H200)
    fused = _warm(store, H200)[0]
    bad = fused / "vllm" / "autotune_configs_dp0_rank0.json"
    bad.write_bytes(corrupt_cache(how))
    refused = run("push", url)
    assert refused.code == 2 and "import would refuse the bundle" in refused.err
    from fi_cache.fleet import bundle
    from tests.conftest import older_namespace_files

    with monkeypatch.context() as older:  # the older fi-cache's push
        older.setattr(bundle, "_namespace_files", older_namespace_files)
        assert run("push", url).code == 0
    result = run("--store", str(store_b), "pull", url)
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert f"bundled cache {bad.relative_to(store).as_posix()}: " in result.err
    assert _files(store_b) == []


def test_a_swapped_bundle_with_a_matching_sidecar_is_still_verified(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, tmp_path: Path
) -> None:
    """Whoever can write the bucket can rewrite both files: import's own checks still apply."""
    remote = tmp_path / "remote"
    _as_machine(monkeypatch, B200)
    _warm(store, B200)
    assert run("push", str(remote)).code == 0
    _as_machine(monkeypatch, H200)
    src, dst = remote / remote_key(B200), remote / remote_key(H200)
    dst.parent.mkdir(parents=True)
    shutil.copy(src, dst)
    sidecar = json.loads(Path(f"{src}.json").read_text())
    Path(f"{dst}.json").write_text(json.dumps({**sidecar, "key": remote_key(H200)}))
    result = run("--store", str(store_b), "pull", str(remote))
    assert result.code == 2 and "bundle is for another environment" in result.err
    assert str(dst) in result.err  # the remote bundle, not the deleted temp file
    assert _files(store_b) == []


def test_a_push_landing_during_a_pull_is_retried_once(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, tmp_path: Path
) -> None:
    remote = tmp_path / "remote"
    _pushed(run, monkeypatch, store, str(remote))
    sidecar_path = Path(f"{remote / remote_key(H200)}.json")
    old_sidecar = sidecar_path.read_bytes()
    shutil.copy(GEMM_618, next((store / "namespaces").rglob("unfused-*")) / "vllm" / "extra.json")
    assert run("push", str(remote)).code == 0
    new_sidecar = sidecar_path.read_bytes()
    sidecar_path.write_bytes(old_sidecar)  # the pull starts before the second push's sidecar
    real = transfer._read_sidecar
    calls = []

    def racing(remote_: Any, key: str) -> Any:
        calls.append(key)
        found = real(remote_, key)
        sidecar_path.write_bytes(new_sidecar)  # ...and the push finishes meanwhile
        return found

    monkeypatch.setattr(transfer, "_read_sidecar", racing)
    result = run("--store", str(store_b), "pull", str(remote))
    assert result.code == 0, result.err
    assert len(calls) == 3  # first read, the re-read that saw the change, the retry's read
    assert _namespace_tree(store_b) == _namespace_tree(store)


# --- refusals before any transfer ---------------------------------------------------------------


def test_push_with_nothing_warmed_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _as_machine(monkeypatch, H200)
    result = run("push", str(tmp_path / "remote"))
    assert result.code == 2 and "nothing to push" in result.err
    assert not (tmp_path / "remote").exists()


def test_push_of_an_undetected_environment_needs_allow_unknown(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path
) -> None:
    """A machine whose GPU and arch were not detected would push to unknown/unknown/..., which
    every other machine whose detection fails alike pulls."""
    blind = H200.replace(gpu=None, arch=None)
    _as_machine(monkeypatch, blind)
    _warm(store, blind)
    remote = tmp_path / "remote"
    result = run("push", str(remote))
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    said = "arch, gpu not detected where it was warmed, so key 0.6.18/unknown/unknown/"
    assert said in result.err
    assert "--allow-unknown" in result.err
    assert _files(remote) == []
    allowed = run("--format", "json", "push", "--allow-unknown", str(remote))
    assert allowed.code == 0, allowed.err
    assert allowed.json()["key"].startswith("0.6.18/unknown/unknown/")


def test_push_of_one_namespace_dir(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path
) -> None:
    _as_machine(monkeypatch, H200)
    fused, _ = _warm(store, H200)
    result = run("--format", "json", "push", str(tmp_path / "r"), "--namespace", str(fused))
    assert result.code == 0, result.err
    assert result.json()["namespaces"] == [fused.relative_to(store).as_posix()]


def test_push_of_several_environments_at_once_is_refused(store: Path, tmp_path: Path) -> None:
    dirs = _warm(store, H200) + _warm(store, B200)
    with pytest.raises(transfer.Refused, match="2 environments selected"):
        transfer.push(store, str(tmp_path / "r"), dirs)


@pytest.mark.parametrize("command", ["push", "pull"])
@pytest.mark.parametrize(
    "url", ["", "-", "   ", "file://", "s3://", "file:///tmp/a\nb", "x\x1b[2J"]
)
def test_a_url_that_names_no_remote_place_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path, command: str, url: str
) -> None:
    """fsspec reads '', '-' and file:// as the working directory: push would write bundles there."""
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    result = run(command, url)
    assert result.code == 2 and result.err.count("\n") == 1 and "Traceback" not in result.err
    assert "names no place" in result.err or "holds a control character" in result.err
    assert repr(url) in result.err or url == "-"  # named, escaped: one line whatever it holds
    assert sorted(tmp_path.rglob("*")) == before  # no bundle in the working directory


@pytest.mark.parametrize(
    ("what", "kind"),
    [(w, k) for w in ("bundle", "sidecar") for k in ("dir", "fifo")]
    + [("url", "fifo"), ("url", "file")],
)
def test_push_to_a_file_remote_replaces_only_files(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path, what: str, kind: str
) -> None:
    """A directory where the bundle goes took it inside (shutil.move); a FIFO was replaced."""
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    remote = tmp_path / "remote"
    key = remote_key(H200)
    target = {"bundle": remote / key, "sidecar": remote / f"{key}.json", "url": remote}[what]
    target.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dir":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.write_text("precious")
    before = sorted(tmp_path.rglob("*"))
    with no_hang():
        result = run("push", remote.as_uri())
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert str(target) in result.err and "Traceback" not in result.err
    assert sorted(tmp_path.rglob("*")) == before  # nothing landed, the node is as it was
    kept = {"dir": target.is_dir, "fifo": target.is_fifo, "file": target.is_file}[kind]
    assert kept()


def test_an_unknown_scheme_is_refused_in_one_line(run: Run, store_b: Path) -> None:
    result = run("--store", str(store_b), "pull", "nosuchproto://bucket/x")
    assert result.code == 2 and "Protocol not known: nosuchproto" in result.err
    assert result.err.count("\n") == 1


def test_without_fsspec_push_and_pull_say_what_to_install(
    run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "fsspec", None)  # makes `import fsspec` fail
    for command in ("push", "pull"):
        result = run(command, "s3://bucket/fleet")
        assert result.code == 2
        assert "push/pull need fsspec: pip install 'fi-cache[fleet]'" in result.err


def test_s3_without_s3fs_names_s3fs(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = importlib.import_module("fsspec.registry")  # `fsspec.registry` is a mapping
    monkeypatch.delitem(registry._registry, "s3", raising=False)
    monkeypatch.setitem(sys.modules, "s3fs", None)
    result = run("pull", "s3://bucket/fleet")
    assert result.code == 2 and result.err.count("\n") == 1
    assert "s3:// needs s3fs" in result.err and "pip install 'fi-cache[fleet]'" in result.err


def test_an_unwritable_remote_fails_with_exit_1(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    result = run("push", str(blocker / "fleet"))
    assert result.code == 1 and "upload failed" in result.err and "Traceback" not in result.err
    assert not list(state_dir(store).glob(f"{TMP_PREFIX}*"))  # local temp removed


# --- progress -----------------------------------------------------------------------------------


def test_progress_is_reported_up_to_the_bundle_size(
    monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, url: str
) -> None:
    _as_machine(monkeypatch, H200)
    dirs = _warm(store, H200)
    ups: list[tuple[int, int]] = []
    downs: list[tuple[int, int]] = []
    pushed = transfer.push(store, url, dirs, lambda d, t: ups.append((d, t)))
    pulled = transfer.pull(store_b, url, progress=lambda d, t: downs.append((d, t)))
    assert ups[-1] == (pushed.size, pushed.size)
    assert downs[0] == (0, pulled.size) and downs[-1] == (pulled.size, pulled.size)
    assert [d for d, _ in downs] == sorted(d for d, _ in downs)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_progress_draws_on_a_terminal_only_for_large_transfers() -> None:
    tty = _Tty()
    bar = LiveProgress("pull", quiet=False, stream=tty)
    bar(0, 1000)
    bar(1000, 1000)
    assert tty.getvalue() == ""  # under 1 MB
    bar(50_000_000, 100_000_000)
    bar(100_000_000, 100_000_000)
    bar.finish()
    lines = tty.getvalue()
    assert lines.startswith("\r\x1b[Kpull 50.0 MB / 100.0 MB (50%, ")
    assert "pull 100.0 MB / 100.0 MB (100%" in lines and lines.endswith("\n")
    plain = io.StringIO()
    LiveProgress("pull", quiet=False, stream=plain)(50_000_000, 100_000_000)
    quiet = _Tty()
    LiveProgress("pull", quiet=True, stream=quiet)(50_000_000, 100_000_000)
    assert plain.getvalue() == quiet.getvalue() == ""


# --- real S3 over HTTP on loopback --------------------------------------------------------------

BUCKET = "fi-cache-fleet"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _aws_env(endpoint: str) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",  # never ask a metadata service for credentials
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "FSSPEC_S3_ENDPOINT_URL": endpoint,
    }


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 and a bucket; s3fs reaches it as a user's would."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _aws_env(endpoint).items():
            mp.setenv(name, value)
        # fsspec reads FSSPEC_S3_* once, at import; this process imported it already.
        mp.setitem(fsspec.config.conf, "s3", {"endpoint_url": endpoint})
        fsspec.filesystem("s3").mkdir(BUCKET)
        yield endpoint
    server.stop()


@pytest.fixture
def s3_url(s3: str) -> str:
    return f"s3://{BUCKET}/{uuid.uuid4().hex}/fleet"


def test_s3_round_trip_over_http(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, s3_url: str
) -> None:
    pushed = _pushed(run, monkeypatch, store, s3_url)
    assert pushed["url"] == f"{s3_url}/{remote_key(H200)}"
    pulled = run("--store", str(store_b), "--format", "json", "pull", s3_url)
    assert pulled.code == 0, pulled.err
    assert pulled.json()["sha256"] == pushed["sha256"]
    assert _namespace_tree(store_b) == _namespace_tree(store)


def test_s3_pull_on_another_machine_lists_the_bucket(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, s3_url: str
) -> None:
    _pushed(run, monkeypatch, store, s3_url)
    _as_machine(monkeypatch, B200)
    result = run("--store", str(store_b), "pull", s3_url)
    assert result.code == 2 and remote_key(B200) in result.err
    assert "1 bundle(s) for other environments: " + remote_key(H200) in result.err
    assert _files(store_b) == []


def test_s3_tampered_object_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, s3_url: str
) -> None:
    _pushed(run, monkeypatch, store, s3_url)
    _flip_byte(s3_url, remote_key(H200), offset=10)
    result = run("--store", str(store_b), "pull", s3_url)
    assert result.code == 2 and "sha256" in result.err
    assert _files(store_b) == []


def test_s3_missing_bucket_is_one_line_exit_1(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, s3: str
) -> None:
    _as_machine(monkeypatch, H200)
    _warm(store, H200)
    result = run("push", "s3://no-such-bucket-here/fleet")
    assert result.code == 1 and result.err.count("\n") == 1
    assert "upload failed" in result.err and "Traceback" not in result.err


def test_s3_pull_from_a_missing_bucket_is_a_storage_failure(
    run: Run, monkeypatch: pytest.MonkeyPatch, store_b: Path, s3: str
) -> None:
    _as_machine(monkeypatch, H200)
    result = run("--store", str(store_b), "pull", "s3://no-such-bucket-here/fleet")
    assert result.code == 1 and result.err.count("\n") == 1, result.err
    assert "the bucket 'no-such-bucket-here' does not exist" in result.err
    assert "no bundle for this machine" not in result.err and _files(store_b) == []
    fsspec.filesystem("s3").mkdir("an-empty-bucket")  # there, but holding nothing: refused, 2
    result = run("--store", str(store_b), "pull", "s3://an-empty-bucket/fleet")
    assert result.code == 2 and "no bundle for this machine" in result.err


def test_s3_unreachable_endpoint_is_one_line_exit_1(
    run: Run, monkeypatch: pytest.MonkeyPatch, store_b: Path, s3: str
) -> None:
    import s3fs

    closed = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    no_retries = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
    conf = {"endpoint_url": closed, "config_kwargs": no_retries}
    monkeypatch.setitem(fsspec.config.conf, "s3", conf)
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    _as_machine(monkeypatch, H200)
    result = run("--store", str(store_b), "pull", f"s3://{BUCKET}/fleet")
    assert result.code == 1 and result.err.count("\n") == 1, result.err
    assert "failed" in result.err and "127.0.0.1" in result.err
    assert _files(store_b) == []


def test_s3_endpoint_from_the_fsspec_environment_variable(
    s3: str, tmp_path: Path, store: Path, store_b: Path
) -> None:
    """Real processes, real environment detection: FSSPEC_S3_ENDPOINT_URL is all they get.
    (This host has no GPU, so the push needs --allow-unknown.)"""
    _warm(store, environment.detect(state_dir(store)).fingerprint)
    env = {**os.environ, **_aws_env(s3), "PYTHONPATH": str(REPO)}
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    for target, command in ((store, ["push", "--allow-unknown"]), (store_b, ["pull"])):
        done = subprocess.run(
            [sys.executable, "-c", _ENTRY, "--store", str(target), *command, url],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr == ""
    assert _namespace_tree(store_b) == _namespace_tree(store)


# The console script with push/pull registered (the lead registers them in fi_cache.cli).
_ENTRY = (
    "import sys; from fi_cache.cli import cli, main; from fi_cache.cli.push_pull import COMMANDS\n"
    "[cli.add_command(c) for c in COMMANDS if c.name not in cli.commands]\n"
    "main(sys.argv[1:])"
)


def test_a_pulled_namespace_manifest_naming_a_file_outside_it_is_refused(
    run: Run, monkeypatch: pytest.MonkeyPatch, store: Path, store_b: Path, tmp_path: Path
) -> None:
    """A bucket's bundle whose namespace manifest names an outside file (the next warm's
    seeding would read it into the namespace, and push would send it on): refused, nothing lands.
    This fi-cache will not push such a manifest: the bundle is one an older fi-cache pushed."""
    remote = tmp_path / "remote"
    _as_machine(monkeypatch, H200)
    fused = _warm(store, H200)[0]
    data = json.loads((fused / manifests.MANIFEST_NAME).read_text())
    outside = {"path": "../../../../../../victim2/x/autotune_configs.json", "entries": 1, "size": 1}
    warm = {
        "started": 1.0,
        "seconds": 1.0,
        "vllm_version": "0.30.0",
        "argv": ["m"],
        "argv_key": "m",
        "supports_finalize_env": None,
    }
    data["warms"] = [{**warm, "files": [outside]}]
    (fused / manifests.MANIFEST_NAME).write_text(json.dumps(data))
    with monkeypatch.context() as older:  # the older fi-cache's push: it read any path
        older.setattr(manifests, "_confined", lambda rel, what: None, raising=False)
        assert run("push", str(remote)).code == 0
    result = run("--store", str(store_b), "pull", str(remote))
    assert result.code == 2 and result.err.count("\n") == 1, result.err
    assert "not a path inside the namespace" in result.err
    assert _files(store_b) == []
