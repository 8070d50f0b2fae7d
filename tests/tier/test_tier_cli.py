"""ls/show/verify/doctor/evict of `mooncake://KEY` against a real Mooncake master: the tables a
fleet's preload daemons share, read and judged as files are (fi_cache/cli/tier.py)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Tier

from fi_cache.tier.keys import rank_key
from fi_cache.tier.mooncake import TierClient
from tests.conftest import GEMM_618, MOE_617_FUSED, Result

Run = Callable[..., Result]

H200 = ["--gpu", "NVIDIA H200", "--flashinfer-version", "0.6.18", "--vllm-version", "0.34.0"]


@pytest.fixture
def client(tier: Tier, monkeypatch: pytest.MonkeyPatch) -> Iterator[TierClient]:
    for name in ("MOONCAKE_CONFIG_PATH", "MC_TCP_BIND_ADDRESS", "FI_CACHE_TIER_TIMEOUT_S"):
        monkeypatch.setenv(name, tier.env[name])
    with TierClient.connect(tier.env, 96 << 20) as c:
        yield c


def _table(gpu: str | None = None, source: object = GEMM_618) -> bytes:
    with open(str(source)) as f:
        doc = json.load(f)
    if gpu is not None:
        doc["_metadata"]["gpu"] = gpu
    return json.dumps(doc).encode()


def _fresh(client: TierClient, config_hash: str, ranks: dict[int, bytes]) -> None:
    for r, data in ranks.items():
        key = rank_key(config_hash, 0, r)
        client.remove(key)
        assert client.publish(key, data).written


def test_ls_lists_every_rank_key_of_a_hash_dir(run: Run, client: TierClient) -> None:
    h = "1" * 64
    _fresh(client, h, {0: _table(), 1: _table()})
    r = run("--format", "json", "ls", f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/")
    assert r.code == 0, r.err
    rows = r.json()["caches"]
    assert [row["path"] for row in rows] == [
        f"mooncake://{rank_key(h, 0, 0)}",
        f"mooncake://{rank_key(h, 0, 1)}",
    ]
    assert rows[0]["gpu"] == "NVIDIA H200" and rows[0]["entries"] == rows[1]["entries"] > 0
    human = run("ls", f"mooncake://{rank_key(h, 0, 1)}")
    assert human.code == 0 and f"mooncake://{rank_key(h, 0, 1)}" in human.out


def test_show_and_verify_decode_a_key_as_a_file(run: Run, client: TierClient) -> None:
    h = "2" * 64
    _fresh(client, h, {0: _table()})
    url = f"mooncake://{rank_key(h, 0, 0)}"
    from_file = run("--format", "json", "show", str(GEMM_618)).json()
    from_tier = run("--format", "json", "show", url).json()
    assert from_tier["path"] == url and from_tier["entries"] == from_file["entries"]
    human = run("show", url)
    assert human.code == 0 and human.out.startswith(url)
    ok = run("verify", url)
    assert ok.code == 0 and f"ok    {url}" in ok.out


def test_a_value_that_is_not_a_table_is_corrupt_and_a_missing_key_refused(
    run: Run, client: TierClient
) -> None:
    h = "3" * 64
    _fresh(client, h, {0: b"\x00not json at all"})
    url = f"mooncake://{rank_key(h, 0, 0)}"
    bad = run("verify", url)
    assert bad.code == 1 and "not a FlashInfer table: invalid JSON" in bad.err.splitlines()[0]
    missing = run("show", f"mooncake://{rank_key(h, 0, 5)}")
    assert missing.code == 2 and "no table under this key" in missing.err
    assert "Traceback" not in bad.err + missing.err


def test_a_key_outside_vllms_scheme_is_refused(run: Run) -> None:
    r = run("show", "mooncake://other/thing.json")
    assert r.code == 2 and "not a vLLM warmup-cache key" in r.err


def test_a_64_mib_value_is_refused_by_its_size_unread(run: Run, client: TierClient) -> None:
    h = "4" * 64
    _fresh(client, h, {0: b"[" * (64 << 20)})
    r = run("verify", f"mooncake://{rank_key(h, 0, 0)}")
    assert r.code == 2 and "64.0 MB is over the 32 MB" in r.err and "not read" in r.err
    client.remove(rank_key(h, 0, 0))


def test_doctor_finds_a_foreign_first_writer_and_evict_removes_it(
    run: Run, client: TierClient
) -> None:
    h = "5" * 64
    _fresh(client, h, {0: _table(), 1: _table("NVIDIA H100 80GB HBM3")})
    hash_dir = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/"
    bad = f"mooncake://{rank_key(h, 0, 1)}"
    r = run("doctor", hash_dir, *H200)
    assert r.code == 1, r.out + r.err
    assert f"error   foreign-environment  {bad}:" in r.out
    assert "every H200 daemon on a fresh node rejects it by `_metadata` and tunes" in r.out
    assert "vLLM never replaces it: first writer wins" in r.out
    assert f"fix: fi-cache evict {bad} --dry-run" in r.out
    assert f"mooncake://{rank_key(h, 0, 0)}:" not in r.out  # the H200 table fits
    plan = run("evict", bad, "--dry-run")
    assert plan.code == 0 and f"would remove {bad}" in plan.out
    assert client.exists([rank_key(h, 0, 1)]) == [True]
    done = run("evict", bad)
    assert done.code == 0 and f"removed {bad}" in done.out
    assert client.exists([rank_key(h, 0, 1)]) == [False]
    assert run("doctor", hash_dir, *H200).code == 0


def test_doctor_flags_a_fused_table_for_an_unfused_fleet_as_a_crash(
    run: Run, client: TierClient
) -> None:
    h = "6" * 64
    _fresh(client, h, {0: _table(source=MOE_617_FUSED)})
    url = f"mooncake://{rank_key(h, 0, 0)}"
    gpu = json.loads(_table(source=MOE_617_FUSED))["_metadata"]["gpu"]
    r = run("doctor", url, "--gpu", gpu, "--flashinfer-version", "0.6.17", "--finalize", "unfused")
    assert r.code == 1, r.out + r.err
    assert f"error   stale-gemm2-profile  {url}:" in r.out
    assert "`Invalid gemm2 profile id` crashes start-up fleet-wide" in r.out
    target = ["--gpu", gpu, "--flashinfer-version", "0.6.17", "--finalize", "unfused"]
    fixed = run("doctor", url, *target, "--fix")
    assert f"removed {url}" in fixed.out
    assert client.exists([rank_key(h, 0, 0)]) == [False]


def test_an_unreachable_master_or_a_bad_config_is_one_line_exit_2(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nobody answers there
    cfg = tmp_path / "mooncake.json"
    cfg.write_text(
        json.dumps(
            {
                "local_hostname": "127.0.0.1",
                "metadata_server": f"http://127.0.0.1:{port}/metadata",
                "master_server_address": f"127.0.0.1:{port}",
                "protocol": "tcp",
            }
        )
    )
    monkeypatch.setenv("MOONCAKE_CONFIG_PATH", str(cfg))
    monkeypatch.setenv("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    monkeypatch.setenv("FI_CACHE_TIER_TIMEOUT_S", "1.5")
    url = f"mooncake://{rank_key('a' * 64, 0, 0)}"
    r = run("ls", url)
    assert r.code == 2 and r.err.count("\n") == 1 and "no answer in 1.5 s" in r.err
    cfg.write_text("{broken")
    bad = run("verify", url)
    assert (
        bad.code == 2
        and bad.err == f"fi-cache: {cfg}: not valid JSON " + bad.err.split("not valid JSON ", 1)[1]
    )
    assert bad.err.count("\n") == 1


def test_rank_tables_that_disagree_are_named_with_the_hash_dirs_remedy(
    run: Run, client: TierClient
) -> None:
    h = "a1" * 32
    doc = json.loads(_table())
    del doc[next(k for k in doc if k.startswith("("))]
    doc.pop("_generation")
    _fresh(client, h, {0: _table(), 1: json.dumps(doc).encode()})
    hash_dir = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}"
    r = run("doctor", hash_dir + "/", *H200)
    assert f"warning vllm-ranks-retune  {hash_dir}:" in r.out, r.out + r.err
    assert "a fresh node's daemons adopt these tables rank by rank" in r.out
    assert f"fix: fi-cache evict {hash_dir}/ --dry-run" in r.out


def test_a_tables_control_characters_reach_the_terminal_escaped(
    run: Run, client: TierClient
) -> None:
    h = "e5" * 32
    _fresh(client, h, {0: _table("NVIDIA \x1b[2JH100"), 1: _table("\x1b]0;pwned\x07")})
    hash_dir = f"mooncake://vllm-warmup-cache/flashinfer_autotune/{h}/"
    for argv in (["ls", hash_dir], ["doctor", hash_dir, *H200]):
        r = run(*argv)
        assert "\x1b" not in r.out + r.err, argv
        assert "\\x1b" in r.out, argv
