"""fi_cache/store/locks/: namespace locks of both strategies name their holder, recover a dead
holder on this host, take over lock files nobody holds, and survive the namespace being moved or
replaced while they are taken."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fi_cache.errors import FiCacheError, Refused
from fi_cache.store import files, locks
from fi_cache.store.in_use import IN_USE_NAME, in_use
from fi_cache.store.locks import process
from fi_cache.store.locks.api import read_holder
from tests.conftest import ROOT, no_hang


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_lock_timeout_names_the_holder(tmp_path: Path, strategy: str) -> None:
    seen = []
    with (
        locks.namespace_lock(tmp_path, "warm", strategy=strategy),
        pytest.raises(FiCacheError, match=f"waiting for warm by pid {os.getpid()} on host"),
        locks.namespace_lock(tmp_path, "other", 0.3, seen.append, strategy),
    ):
        pass
    assert seen and seen[0] is not None and seen[0].purpose == "warm"
    with locks.namespace_lock(tmp_path, "again", timeout=0.3, strategy=strategy):
        pass  # released on exit


def _plant_dead_holder(directory: Path) -> None:
    """A lock file naming a process of this host that has exited (what a SIGKILLed warm leaves)."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (directory / locks.LOCK_NAME).write_text(json.dumps(holder))


def test_lockfile_of_a_dead_holder_on_this_host_is_recovered(tmp_path: Path) -> None:
    _plant_dead_holder(tmp_path)
    with locks.namespace_lock(tmp_path, "warm", timeout=1, strategy="lockfile") as me:
        assert me.pid == os.getpid()


def test_lockfile_of_another_host_is_not_broken(tmp_path: Path) -> None:
    holder = {"pid": 1, "host": "elsewhere", "since": 0.0, "purpose": "warm"}
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps(holder))
    with (
        pytest.raises(FiCacheError, match="on host elsewhere"),
        locks.namespace_lock(tmp_path, "warm", timeout=0.2, strategy="lockfile"),
    ):
        pass


def test_local_filesystem_uses_flock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    kind, why = locks.lock_strategy(tmp_path)
    assert kind == "flock" and "honours flock" in why


def test_network_filesystems_use_a_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    monkeypatch.setattr(locks, "filesystem_type", lambda p: "nfs4")
    assert locks.lock_strategy(tmp_path)[0] == "lockfile"
    monkeypatch.setenv("FI_CACHE_LOCK", "flock")
    assert locks.lock_strategy(tmp_path) == ("flock", "set by FI_CACHE_LOCK")


@pytest.mark.parametrize("left", ["dead holder", "empty"])
def test_waiters_on_a_dead_holders_lockfile_take_it_one_at_a_time(
    tmp_path: Path, left: str
) -> None:
    if left == "empty":  # what the flock strategy leaves
        _leftover_lock(tmp_path)
    else:
        _plant_dead_holder(tmp_path)
    code = (
        "import os, sys, time; from pathlib import Path; from fi_cache.store import locks\n"
        "d = Path(sys.argv[1])\n"
        "with locks.namespace_lock(d, 'w', 30, strategy='lockfile'):\n"
        "    try:\n"
        "        fd = os.open(d / 'inside', os.O_CREAT | os.O_EXCL)\n"
        "    except FileExistsError:\n"
        "        sys.exit(3)\n"
        "    time.sleep(0.2); os.close(fd); os.unlink(d / 'inside')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env) for _ in range(6)
    ]
    assert [p.wait(60) for p in procs] == [0] * 6
    assert not (tmp_path / locks.LOCK_NAME).exists()


def test_concurrent_lock_strategy_probes_agree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe must not take another process's probe lock for a filesystem that ignores flock."""
    import fcntl

    monkeypatch.delenv("FI_CACHE_LOCK", raising=False)
    other = os.open(tmp_path / f"{files.TMP_PREFIX}flock-probe", os.O_CREAT | os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX)  # what a concurrent probe under the old fixed name held
    try:
        assert locks.lock_strategy(tmp_path)[0] == "flock"
    finally:
        os.close(other)


def test_a_lock_leaves_a_holder_file_it_did_not_write(tmp_path: Path) -> None:
    """After an import swapped the dir, the holder file there is the newcomer's: keep it."""
    with locks.namespace_lock(tmp_path, "import", strategy="flock"):
        theirs = tmp_path / "theirs"
        theirs.write_text('{"pid": 1, "host": "h", "since": 0, "purpose": "warm"}')
        os.replace(theirs, tmp_path / locks.HOLDER_NAME)
    assert (tmp_path / locks.HOLDER_NAME).exists()
    with locks.namespace_lock(tmp_path, "warm", strategy="flock"):
        pass
    assert not (tmp_path / locks.HOLDER_NAME).exists()  # its own is removed


def test_a_dead_holders_lock_that_cannot_be_moved_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another user's lock file in a sticky dir: waiting ends at the timeout, no busy loop."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    holder = {"pid": int(dead.stdout), "host": os.uname().nodename, "since": 0.0, "purpose": "warm"}
    (tmp_path / locks.LOCK_NAME).write_text(json.dumps(holder))

    def rename(*a: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "rename", rename)
    import threading

    seen: list[BaseException] = []

    def take() -> None:
        try:
            with locks.namespace_lock(tmp_path, "warm", timeout=0.3, strategy="lockfile"):
                pass
        except BaseException as exc:  # the test looks at it
            seen.append(exc)

    waiter = threading.Thread(target=take, daemon=True)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive(), "still trying to take the lock after 10 s"
    assert len(seen) == 1 and isinstance(seen[0], FiCacheError)
    assert "timed out after 0s" in str(seen[0])


def test_lock_retries_when_its_dir_is_moved_before_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "ns"
    real_open, moved = os.open, []

    def open_(path: object, *a: object, **k: object) -> int:
        if str(path).endswith(locks.LOCK_NAME) and not moved:
            moved.append(d.rename(tmp_path / "aside"))  # an import swaps the dir just now
        return real_open(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", open_)
    with locks.namespace_lock(d, "warm", timeout=2, strategy="flock"):
        assert moved and (d / locks.LOCK_NAME).exists()


def test_prune_lock_refuses_a_namespace_replaced_since_its_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = tmp_path / "ns"
    d.mkdir()
    real_open = os.open

    def open_(path: object, *a: object, **k: object) -> int:
        fd = real_open(path, *a, **k)  # type: ignore[arg-type]
        if str(path).endswith(locks.LOCK_NAME):
            d.rename(tmp_path / "old")  # an import installs a new namespace just now
            d.mkdir()
        return fd

    monkeypatch.setattr(os, "open", open_)
    with (
        pytest.raises(locks.NamespaceBusy),
        locks.try_namespace_lock(d, "prune", "flock"),
    ):
        pass


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_prune_lock_on_a_namespace_moved_away_is_busy_not_an_error(
    tmp_path: Path, strategy: str
) -> None:
    """Between prune's look and its lock an import (two renames) moved the dir: skip it."""
    with (
        pytest.raises(locks.NamespaceBusy),
        locks.try_namespace_lock(tmp_path / "gone", "prune", strategy),
    ):
        pass


# --- lock files without a live holder ------------------------------------------------------------


def _leftover_lock(directory: Path, content: bytes = b"", age: float = 3600.0) -> Path:
    """A `.fi-cache.lock` nobody holds: what the flock strategy leaves in every namespace (empty),
    or a killed writer's garbage, written `age` seconds ago."""
    lock = directory / locks.LOCK_NAME
    lock.write_bytes(content)
    then = time.time() - age
    os.utime(lock, (then, then))
    return lock


def _no_hard_links(*a: object) -> None:
    raise PermissionError(1, "Operation not permitted")


@pytest.mark.parametrize("content", [b"", b"\x00garbage{", b'{"pid": "x"}'])
@pytest.mark.parametrize("links", [True, False])
def test_a_lock_file_without_a_holder_is_not_a_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, links: bool
) -> None:
    """NFS stores used with flock before (or FI_CACHE_LOCK=lockfile on one): the leftover
    lock file must not make every warm wait out its timeout nor every prune skip."""
    if not links:  # a filesystem without hard links: the lock is made in place
        monkeypatch.setattr(os, "link", _no_hard_links)
    _leftover_lock(tmp_path, content)
    assert locks.probe_namespace_lock(tmp_path, "lockfile") == (False, None)
    with locks.namespace_lock(tmp_path, "warm", timeout=0.5, strategy="lockfile") as me:
        taken = json.loads((tmp_path / locks.LOCK_NAME).read_text())
        assert taken["pid"] == me.pid == os.getpid()
        assert locks.probe_namespace_lock(tmp_path, "lockfile")[0]  # and it is held now
    assert not (tmp_path / locks.LOCK_NAME).exists()
    _leftover_lock(tmp_path, content)
    with locks.try_namespace_lock(tmp_path, "prune", "lockfile"):
        pass
    assert [p.name for p in tmp_path.iterdir()] == []  # no temp file, no moved-aside lock left


def test_an_empty_lock_file_being_written_is_waited_for(tmp_path: Path) -> None:
    """O_EXCL then write (no hard links, or an older fi-cache): a fresh empty lock file is a
    holder that has not written its name yet; an old one is a leftover."""
    _leftover_lock(tmp_path, age=0)
    assert locks.probe_namespace_lock(tmp_path, "lockfile") == (True, None)
    with (
        pytest.raises(FiCacheError, match="timed out after 0s waiting for another process"),
        locks.namespace_lock(tmp_path, "warm", timeout=0.3, strategy="lockfile"),
    ):
        pass
    _leftover_lock(tmp_path, age=60)
    with locks.namespace_lock(tmp_path, "warm", timeout=0.3, strategy="lockfile"):
        pass


def test_a_live_flock_holder_blocks_the_lockfile_strategy(tmp_path: Path) -> None:
    """One node forced to lock files, another on flock, one local store: the lock file the flock
    holder has open is empty, yet held, and its holder is named."""
    code = (
        "import sys, time; from pathlib import Path; from fi_cache.store import locks\n"
        "with locks.namespace_lock(Path(sys.argv[1]), 'warm', strategy='flock'):\n"
        "    print('held', flush=True); time.sleep(30)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        lock = tmp_path / locks.LOCK_NAME
        then = time.time() - 3600
        os.utime(lock, (then, then))  # old: only the flock says it is held
        held, who = locks.probe_namespace_lock(tmp_path, "lockfile")
        assert held and who is not None and who.pid == holder.pid
        with (
            pytest.raises(FiCacheError, match=f"waiting for warm by pid {holder.pid} on host"),
            locks.namespace_lock(tmp_path, "import", timeout=0.3, strategy="lockfile"),
        ):
            pass
        with (
            pytest.raises(locks.NamespaceBusy),
            locks.try_namespace_lock(tmp_path, "prune", "lockfile"),
        ):
            pass
    finally:
        holder.kill()
        holder.wait(10)
    with locks.namespace_lock(tmp_path, "warm", timeout=0.5, strategy="lockfile"):
        pass  # its holder is gone: the empty file is a leftover now


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
@pytest.mark.parametrize("name", [locks.LOCK_NAME, locks.HOLDER_NAME, IN_USE_NAME])
def test_a_fifo_planted_as_a_lock_file_never_makes_a_look_wait(
    tmp_path: Path, strategy: str, name: str
) -> None:
    """prune --dry-run probes, prune and import ask whether a server holds the namespace:
    neither may block in an open() of a FIFO put there (it would wait for a writer forever)."""
    os.mkfifo(tmp_path / name)
    with no_hang():
        assert locks.probe_namespace_lock(tmp_path, strategy)[1] is None
        assert not in_use(tmp_path)
        assert read_holder(tmp_path / name) is None


def test_holding_in_use_says_flock_is_trusted_even_when_the_mark_is_refused_just_then(
    tmp_path: Path,
) -> None:
    """prune and import take the in-use file exclusively for an instant: a serve then gets no
    mark, but the store still trusts flock (serve's memo takes the mark again at each replay)."""
    import fcntl

    os.close(os.open(tmp_path / IN_USE_NAME, os.O_CREAT | os.O_RDWR, 0o644))
    fd = os.open(tmp_path / IN_USE_NAME, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        assert locks.hold_in_use(tmp_path) == (True, None)
    finally:
        os.close(fd)
    trusted, mark = locks.hold_in_use(tmp_path)
    assert trusted and mark is not None and in_use(tmp_path)
    os.close(mark)


def test_a_private_dir_goes_under_a_dir_open_to_every_user(tmp_path: Path) -> None:
    """serve's memos of a store shared through a group: one private dir per user, under one
    that every user can create theirs in (sticky, as /tmp)."""
    mine = tmp_path / "serve" / str(os.getuid())
    files.write_private(mine, "m", b"x")
    assert (tmp_path / "serve").stat().st_mode & 0o7777 == 0o1777
    assert mine.stat().st_mode & 0o777 == 0o700 and (mine / "m").stat().st_mode & 0o777 == 0o600


# --- a live pid is not always the holder: reboots and reused pids (the lock-file strategy) ------

needs_proc = pytest.mark.skipif(
    process.boot_time() is None or process.boot_id() is None, reason="no Linux /proc here"
)


@contextlib.contextmanager
def _sleeper(new_session: bool = False) -> Iterator[int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=new_session
    )
    try:
        while process.start_ticks(proc.pid) is None:
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def newcomer() -> Iterator[int]:
    """A live process that is no lock's holder: what a reused pid is."""
    with _sleeper() as pid:
        yield pid


def _plant(directory: Path, **holder: object) -> None:
    record = {"host": os.uname().nodename, "purpose": "warm", "guard": None, **holder}
    _leftover_lock(directory, json.dumps(record).encode())


@needs_proc
@pytest.mark.parametrize(
    "record",
    [
        {"pid": 1, "since": 0.0},  # what the attack planted: pid 1 is alive after any reboot
        {"pid": 1, "since": "now", "boot": "a-boot-before-this-one"},
        {"pid": "newcomer", "since": "now", "boot": "this", "start": "not-its-start"},
        {"pid": "newcomer", "since": "before-it-started"},  # an older record: no start time
    ],
    ids=["before-boot-by-time", "before-boot-by-id", "reused-pid", "reused-pid-old-record"],
)
def test_a_live_pid_that_is_not_the_holder_does_not_hold_the_lock(
    tmp_path: Path, newcomer: int, record: dict[str, object]
) -> None:
    """warm waited out its --lock-timeout (an hour), import 60 s, prune skipped it as locked."""
    pid = newcomer if record["pid"] == "newcomer" else 1
    began = process.started_at(newcomer)
    assert began is not None
    values = {
        "now": time.time(),
        "before-it-started": began - 60,
        "this": process.boot_id(),
        "not-its-start": (process.start_ticks(newcomer) or 0) + 1,
    }
    planted = {k: values.get(v, v) if isinstance(v, str) else v for k, v in record.items()}
    _plant(tmp_path, **{**planted, "pid": pid})
    assert locks.probe_namespace_lock(tmp_path, "lockfile")[0] is False
    with no_hang(), locks.namespace_lock(tmp_path, "warm", timeout=30, strategy="lockfile") as me:
        assert json.loads((tmp_path / locks.LOCK_NAME).read_text())["pid"] == me.pid


@needs_proc
def test_the_live_holder_itself_still_holds_it(tmp_path: Path, newcomer: int) -> None:
    """The control: the same record naming the process as it is, is a holder."""
    start = process.start_ticks(newcomer)
    _plant(tmp_path, pid=newcomer, since=time.time(), boot=process.boot_id(), start=start)
    assert locks.probe_namespace_lock(tmp_path, "lockfile")[0] is True
    with (
        pytest.raises(FiCacheError, match=f"waiting for warm by pid {newcomer}"),
        locks.namespace_lock(tmp_path, "warm", timeout=0.3, strategy="lockfile"),
    ):
        pass


@pytest.fixture
def dead_pid() -> int:
    """A holder that was SIGKILLed: its guard is what keeps the lock, if anything does."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def live_guard() -> Iterator[int]:
    """A process as a guard is: alive, and leading a session of its own."""
    with _sleeper(new_session=True) as pid:
        yield pid


def _plant_guarded(directory: Path, holder: int, guard: int, guard_start: int | None) -> None:
    """A killed holder's record naming its guard (and the guard's start, unless None)."""
    record = {"pid": holder, "since": time.time(), "boot": process.boot_id(), "start": 1}
    started = {} if guard_start is None else {"guard_start": guard_start}
    _plant(directory, **record, guard=guard, **started)


@needs_proc
@pytest.mark.parametrize("guard_start", ["not-its-start", "unrecorded"])
def test_a_reused_guard_pid_does_not_hold_a_dead_holders_lock(
    tmp_path: Path, dead_pid: int, newcomer: int, guard_start: str
) -> None:
    """A guard's pid alive again as another process kept the lock for that process's life (a
    record without the guard's start: any live pid did)."""
    wrong = (process.start_ticks(newcomer) or 0) + 1 if guard_start == "not-its-start" else None
    _plant_guarded(tmp_path, dead_pid, newcomer, wrong)
    assert locks.probe_namespace_lock(tmp_path, "lockfile")[0] is False
    with no_hang(), locks.namespace_lock(tmp_path, "warm", timeout=30, strategy="lockfile") as me:
        assert json.loads((tmp_path / locks.LOCK_NAME).read_text())["pid"] == me.pid


@needs_proc
@pytest.mark.parametrize("guard_start", ["its-start", "unrecorded"])
def test_the_live_guard_of_a_dead_holder_still_holds_it(
    tmp_path: Path, dead_pid: int, live_guard: int, guard_start: str
) -> None:
    """The control: the guard still stopping what its killed holder started keeps the lock."""
    start = process.start_ticks(live_guard) if guard_start == "its-start" else None
    _plant_guarded(tmp_path, dead_pid, live_guard, start)
    assert locks.probe_namespace_lock(tmp_path, "lockfile")[0] is True
    with (
        pytest.raises(FiCacheError, match=f"waiting for warm by pid {dead_pid}"),
        locks.namespace_lock(tmp_path, "warm", timeout=0.3, strategy="lockfile"),
    ):
        pass


def test_a_lock_records_which_process_took_it(tmp_path: Path) -> None:
    with locks.namespace_lock(tmp_path, "warm", timeout=1, strategy="lockfile") as me:
        taken = read_holder(tmp_path / locks.LOCK_NAME)
    assert taken == me and me.start == process.start_ticks(os.getpid())
    assert me.boot == process.boot_id()


# --- a lock path that is no lock file: healed, or refused saying how ----------------------------


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
@pytest.mark.parametrize("kind", ["empty-dir", "dangling-link", "link-out", "fifo"])
def test_a_lock_path_that_is_no_lock_file_is_cleared_and_never_followed(
    tmp_path: Path, strategy: str, kind: str
) -> None:
    ns, outside = tmp_path / "ns", tmp_path / "outside"
    ns.mkdir()
    lock = ns / locks.LOCK_NAME
    if kind == "empty-dir":
        lock.mkdir()
    elif kind == "fifo":
        os.mkfifo(lock)
    else:  # a link out of the namespace: a lock must never create or lock a file there
        lock.symlink_to(outside if kind == "link-out" else tmp_path / "gone" / "x")
    assert locks.probe_namespace_lock(ns, strategy) == (False, None)  # dry run = apply
    with no_hang():
        with locks.namespace_lock(ns, "warm", timeout=2, strategy=strategy):
            assert not lock.is_symlink() and lock.is_file()
        with locks.try_namespace_lock(ns, "prune", strategy):
            pass
    assert not outside.exists() and not (tmp_path / "gone").exists()
    assert not [p for p in ns.iterdir() if p.name.endswith(".tmp")]  # nothing moved aside left


@pytest.mark.parametrize("strategy", ["flock", "lockfile"])
def test_a_lock_path_that_is_a_dir_with_files_is_refused_saying_how(
    tmp_path: Path, strategy: str
) -> None:
    lock = tmp_path / locks.LOCK_NAME
    lock.mkdir()
    (lock / "notes.txt").write_text("someone's")
    for take in (
        lambda: locks.namespace_lock(tmp_path, "warm", timeout=2, strategy=strategy),
        lambda: locks.try_namespace_lock(tmp_path, "prune", strategy),
    ):
        with pytest.raises(Refused, match="is a directory, not a lock file: move it out"), take():
            pass
    assert (lock / "notes.txt").read_text() == "someone's"  # never deleted


# --- one helper for "this namespace's lock, if the path is in one" (evict, doctor --fix) --------


def test_namespace_lock_if_any_holds_an_existing_namespace_and_makes_no_other(
    tmp_path: Path,
) -> None:
    ns = tmp_path / "ns"
    ns.mkdir()
    with locks.namespace_lock_if_any(ns, "evict", timeout=1) as me:
        assert me is not None and me.purpose == "evict"
        assert locks.probe_namespace_lock(ns, locks.lock_strategy(ns)[0])[0]
    gone = tmp_path / "pruned"  # deleted since the plan: never made again, empty
    with locks.namespace_lock_if_any(gone, "doctor --fix", timeout=1) as me:
        assert me is None
    with locks.namespace_lock_if_any(None, "evict", timeout=1) as me:
        assert me is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ns"]
