"""vLLM 0.34's tier key scheme (fi_cache/tier/keys.py) against the wheel's own text, and the
`mooncake://` arguments a command accepts or refuses."""

from __future__ import annotations

from pathlib import Path

import pytest

from fi_cache.errors import Refused
from fi_cache.tier.keys import TierKey, parse_arg, rank_key, split_args
from tests.vllm_wheels import module_text, need

STORE = "vllm/model_executor/model_loader/weight_cache/artifact_store.py"
H = "ab" * 32


def _lines(module: str, first: int, last: int) -> str:
    return "\n".join(module_text("0.34.0", module).splitlines()[first - 1 : last])


def test_the_cited_wheel_lines_say_what_versions_tier_says() -> None:
    need("0.34.0")
    assert '_KEY_PREFIX = "vllm-warmup-cache"' in _lines(STORE, 28, 28)
    assert 'return f"{_KEY_PREFIX}/{kind}/{config_hash}/{filename}"' in _lines(STORE, 31, 33)
    put = _lines(STORE, 101, 107)
    assert "if self._store.is_exist(key) == 1:\n            return" in put
    for module in ("artifact_store.py", "warmup_cache.py", "daemon.py", "seed.py"):
        text = module_text("0.34.0", f"vllm/model_executor/model_loader/weight_cache/{module}")
        assert "._store.remove" not in text and "remove_by_regex" not in text  # no key deleted
    warmup = "vllm/model_executor/model_loader/weight_cache/warmup_cache.py"
    assert 'kind = "flashinfer_autotune"' in _lines(warmup, 60, 60)
    assert "def _adopt_from_stores" in _lines(warmup, 147, 147)
    assert "MOONCAKE_CONFIG_PATH" in _lines("vllm/distributed/mooncake_store.py", 86, 93)


def test_a_hash_dir_argument_probes_every_rank_name_and_a_key_names_one() -> None:
    one = parse_arg(Path(f"mooncake://{rank_key(H, 1, 3)}"))  # as click hands it over: "mooncake:/"
    assert one.one == TierKey(H, 1, 3) and one.text == f"mooncake://{rank_key(H, 1, 3)}"
    every = parse_arg(f"mooncake://vllm-warmup-cache/flashinfer_autotune/{H}/")
    assert every.one is None and TierKey(H, 0, 0) in every.candidates()
    assert TierKey(H, 31, 511) in every.candidates()


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("mooncake://other/x.json", "not a vLLM warmup-cache key"),
        ("mooncake://vllm-warmup-cache/flashinfer_autotune/ABC/", "64 lowercase hex"),
        (f"mooncake://vllm-warmup-cache/flashinfer_autotune/{H}/notes.txt", "rank table name"),
    ],
)
def test_other_keys_are_refused(arg: str, says: str) -> None:
    with pytest.raises(Refused, match=says):
        parse_arg(arg)


def test_keys_and_paths_do_not_mix_in_one_command() -> None:
    with pytest.raises(Refused, match="not both"):
        split_args((Path(f"mooncake://{rank_key(H, 0, 0)}"), Path("x.json")))
