"""The tier client against a real Mooncake master (conftest.py): reads, first-writer-wins
publishing, removal, and the refusals (no master, a bad MOONCAKE_CONFIG_PATH)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from conftest import Tier

from fi_cache.errors import Refused
from fi_cache.tier.keys import rank_key
from fi_cache.tier.mooncake import TierClient
from tests.conftest import no_hang

HASH = "ab" * 32


def test_publish_is_first_writer_wins_and_remove_clears_the_key(tier: Tier) -> None:
    key = rank_key(HASH, 0, 7)
    with TierClient.connect(tier.env, 1 << 20) as client:
        assert client.size(key) is None
        assert client.publish(key, b'{"a": 1}').written
        assert not client.publish(key, b'{"b": 2}').written  # the first table stays
        assert client.exists([key, rank_key(HASH, 0, 8)]) == [True, False]
        assert client.size(key) == 8
        assert client.get(key) == b'{"a": 1}'
        assert client.remove(key)
        assert not client.remove(key)
        assert client.publish(key, b'{"b": 2}').written
        assert client.get(key) == b'{"b": 2}'
        assert client.remove(key)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_master_is_a_refusal_after_the_timeout_not_a_hang(
    tier: Tier, tmp_path: Path
) -> None:
    port = _closed_port()
    cfg = tmp_path / "mc.json"
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
    env = {**tier.env, "MOONCAKE_CONFIG_PATH": str(cfg), "FI_CACHE_TIER_TIMEOUT_S": "1.5"}
    with pytest.raises(Refused, match=f"cannot connect to the Mooncake master 127.0.0.1:{port}"):
        TierClient.connect(env, 1 << 20)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"metadata_server": "http://127.0.0.1:1/metadata"}', "no master_server_address"),
        ('{"master_server_address": 5, "metadata_server": "x"}', "must be a string"),
    ],
)
def test_a_malformed_config_is_refused_before_any_connection(
    tmp_path: Path, text: str, says: str
) -> None:
    cfg = tmp_path / "mc.json"
    cfg.write_text(text)
    with pytest.raises(Refused, match=says) as info:
        TierClient.connect({"MOONCAKE_CONFIG_PATH": str(cfg)}, 1 << 20)
    assert info.value.path == str(cfg)


def test_no_config_variable_says_which_variable() -> None:
    with pytest.raises(Refused, match="MOONCAKE_CONFIG_PATH is not set"):
        TierClient.connect({}, 1 << 20)


def test_a_fifo_as_config_is_refused_without_opening_it(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "mooncake.json"
    os.mkfifo(fifo)  # open() would wait for a writer forever
    with no_hang(), pytest.raises(Refused, match="is a FIFO, not a Mooncake config"):
        TierClient.connect({"MOONCAKE_CONFIG_PATH": str(fifo)}, 1 << 20)
