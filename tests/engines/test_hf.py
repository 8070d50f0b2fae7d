"""engines/hf.py: the config.json a model argument names, as huggingface_hub lays its cache out."""

from __future__ import annotations

from pathlib import Path

from fi_cache.engines import hf


def _hub(root: Path, model: str, text: str, revision: str = "r1", ref: bool = True) -> Path:
    repo = root / ("models--" + model.replace("/", "--"))
    (repo / "snapshots" / revision).mkdir(parents=True)
    (repo / "snapshots" / revision / "config.json").write_text(text)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
    return repo


def test_an_hf_id_is_read_from_the_snapshot_refs_main_names(tmp_path: Path) -> None:
    _hub(tmp_path / "home" / ".cache" / "huggingface" / "hub", "Org/M", '{"model_type": "x"}')
    env = {"HOME": str(tmp_path / "home")}
    assert hf.read_config("Org/M", env) == {"model_type": "x"}
    assert hf.read_config("Org/Other", env) is None


def test_hf_hub_cache_and_hf_home_move_it(tmp_path: Path) -> None:
    _hub(tmp_path / "hc", "Org/M", "{}", ref=False)  # an offline copy: no refs/main
    assert hf.config_file("Org/M", {"HF_HUB_CACHE": str(tmp_path / "hc")}) is not None
    _hub(tmp_path / "hh" / "hub", "Org/N", "{}")
    assert hf.config_file("Org/N", {"HF_HOME": str(tmp_path / "hh")}) is not None


def test_a_local_copy_is_the_same_model_and_another_config_is_not(tmp_path: Path) -> None:
    _hub(tmp_path / "hc", "Org/M", '{"a": 1}')
    env = {"HF_HUB_CACHE": str(tmp_path / "hc")}
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "config.json").write_text('{"a": 1}')
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text('{"a": 2}')
    assert hf.same_model("Org/M", str(tmp_path / "copy"), env)
    assert not hf.same_model("Org/M", str(tmp_path / "other"), env)
    assert not hf.same_model("Org/M", "Org/Unknown", env)  # nothing to compare: not the same
    assert hf.same_model("Org/Unknown", "Org/Unknown", env)


def test_a_config_that_is_not_json_or_not_an_object_is_none(tmp_path: Path) -> None:
    for name, text in (("a", "not json"), ("b", "[1]")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        assert hf.read_config(str(tmp_path / name), {}) is None


def test_a_fifo_or_endless_file_as_config_json_is_no_config_and_never_waits(
    tmp_path: Path,
) -> None:
    import os

    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "config.json")
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "config.json").symlink_to("/dev/zero")
    assert hf.read_config(str(tmp_path / "fifo"), {}) is None
    assert hf.read_config(str(tmp_path / "zero"), {}) is None
