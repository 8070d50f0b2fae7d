"""The hostile-input attack of issue 25 (shared/attack), kept as bounded tests: its cases that no
dedicated test holds yet, each run through the CLI on inputs built in tmp_path.

shared/attack/repro.sh's one-line reproductions, each held elsewhere (not repeated here):
  1  export -o / plan -o onto a device node: fleet/test_bundle.py
     test_export_o_never_replaces_a_device_fifo_socket_or_dir, cli/test_plan_cli.py
     test_plan_o_never_replaces_a_device_fifo_socket_or_dir
  2  import of a cache verify calls corrupt (key '('): fleet/test_bundle.py
     test_a_cache_member_verify_calls_corrupt_is_refused_before_anything_lands
  3  --store that is a symlink loop: store/test_paths.py
     test_a_store_that_cannot_be_one_is_refused_in_one_line
  4  doctor --log on a line of near-miss messages: doctor/test_logs.py
     test_a_megabyte_line_of_near_miss_messages_is_read_in_time_and_its_messages_found
  5  a 16 MB key: model/test_keys.py
     test_verify_reports_a_key_longer_than_flashinfer_writes_as_a_defect_naming_it,
     test_a_long_key_under_the_limit_parses_in_memory_proportional_to_it
  6  plan --check / warm --plan of a FIFO or /dev/zero: cli/test_plan_cli.py
     test_plan_refuses_a_fifo_or_endless_file_at_once, cli/test_warm_flashinfer_cli.py
     test_a_fifo_or_device_as_the_plan_is_refused_at_once
  7  v2 JSON in UTF-16, with a BOM or raw surrogate bytes: cli/test_verify_cli.py
     test_v2_json_flashinfer_cannot_decode_is_corrupt (import: fleet/test_bundle.py)
  8  a FIFO as the cached FlashInfer answer / as the in-use file: test_environment.py
     test_a_fifo_as_the_cached_answer_is_named_and_flashinfer_asked_again, fleet/test_bundle.py
     test_a_fifo_planted_as_the_in_use_file_does_not_hang_an_import
  9  pull of a file:// remote whose sidecar is a FIFO: fleet/test_transfer.py
     test_a_fifo_or_endless_device_on_a_file_remote_is_refused_at_once
  10 a lock-file record naming pid 1 from before this boot: store/test_locks.py
     (the before-boot-by-time case of the reboot/reused-pid tests)
  11 nvidia-smi printing bytes that are not UTF-8: test_environment.py
     test_nvidia_smi_and_nvcc_printing_bytes_that_are_not_utf8_are_no_traceback
  12 plan --check of a 5000-digit integer: engines/flashinfer/test_plan.py
     test_an_integer_too_long_to_read_is_refused_in_one_line
  13 push '' / push -: fleet/test_transfer.py test_a_url_that_names_no_remote_place_is_refused

Held here: what the attack's scripts still found (fs_hazards.py: a symlink loop given where a
command names an output file or a namespace was a RuntimeError traceback; `merge -o LINK` read
the link's target first, then replaced the link with the union and left the target as it was).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import GEMM_617, GEMM_618, Result, vllm_026_namespace


def _loop(tmp_path: Path) -> Path:
    """a -> b -> a: resolving it never ends (Python < 3.13 raises RuntimeError, not OSError)."""
    a, b = tmp_path / "loop-a.json", tmp_path / "loop-b.json"
    a.symlink_to(b)
    b.symlink_to(a)
    return a


def _one_line_refusal(r: Result) -> str:
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert r.code == 2 and len(lines) == 1 and lines[0].startswith("fi-cache: "), r.err
    return lines[0]


def test_merge_o_a_symlink_loop_is_refused_in_one_line(
    run: Callable[..., Result], tmp_path: Path
) -> None:
    loop = _loop(tmp_path)
    line = _one_line_refusal(run("merge", GEMM_617, "-o", loop))
    assert "Too many levels of symbolic links" in line, line
    assert loop.is_symlink() and not loop.exists()  # still the loop: nothing written there


@pytest.mark.parametrize(
    "argv",
    [["export", "{loop}", "-o", "{out}"], ["pin", "{loop}"], ["unpin", "{loop}"]],
    ids=["export", "pin", "unpin"],
)
def test_a_namespace_named_by_a_symlink_loop_is_no_namespace(
    run: Callable[..., Result], tmp_path: Path, argv: list[str]
) -> None:
    loop, out = _loop(tmp_path), tmp_path / "out.tar.gz"
    r = run(*(a.format(loop=loop, out=out) for a in argv))
    line = _one_line_refusal(r)
    assert f"no namespace {str(loop)!r} in the store" in line, line
    assert not out.exists()


def test_an_output_that_is_a_link_is_written_through_and_the_link_stays(
    run: Callable[..., Result], tmp_path: Path, store: Path
) -> None:
    """As `cp` and a shell redirection: `-o LINK` writes LINK's target (merge read it first)."""
    from fi_cache.model import v1

    target, link = tmp_path / "shared" / "cache.json", tmp_path / "cache.json"
    target.parent.mkdir()
    whole = v1.loads(GEMM_618.read_bytes())
    part = v1.CacheFile(whole.metadata, dict(list(whole.entries.items())[3:]), None, None)
    target.write_text(v1.dumps(part))
    link.symlink_to(target)
    before = set(whole.entries)
    r = run("merge", GEMM_618, "-o", link)
    assert r.code == 0, r.err
    assert link.is_symlink() and set(v1.loads(target.read_bytes()).entries) == before
    bundle_target, bundle_link = tmp_path / "shared" / "b.tar.gz", tmp_path / "b.tar.gz"
    bundle_link.symlink_to(bundle_target)  # dangling: its target is made
    ns = vllm_026_namespace(store)
    r = run("export", ns, "-o", bundle_link)
    assert r.code == 0, r.err
    assert bundle_link.is_symlink() and bundle_target.is_file()
