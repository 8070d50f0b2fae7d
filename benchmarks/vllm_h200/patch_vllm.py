"""Patch an installed vLLM 0.26.0 to read VLLM_FLASHINFER_MOE_FUSED_FINALIZE (vLLM PR #54948, open).

RESULTS QUOTED WITH THIS PATCH ARE FROM A PATCHED vLLM 0.26.0, NOT A RELEASE: no release up to 0.33
reads the variable. The patch does what the PR describes (two files, +10 lines): `vllm/envs.py`
registers the variable (default 1 = fused finalize, today's behaviour), and
`vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py` passes
`use_fused_finalize=envs.VLLM_FLASHINFER_MOE_FUSED_FINALIZE` to `flashinfer_cutlass_fused_moe`
(FlashInfer 0.6.17's `cutlass_fused_moe` has the argument, default True: fused_moe/core.py:943).

A registered variable is hashed into vLLM 0.25-0.29's autotune-cache dir name (envs.compile_factors
hashes every registered name but an ignore list), so on 0.26 the two modes land in two hash dirs.
`--unhashed` also puts the name on that ignore list (as vLLM 0.30+ behaves, whose hash has no env
vars), so both modes share one file; the PR's diff is not public, so which one it does is unknown.

    python3 patch_vllm.py SITE_PACKAGES [--unhashed]   # idempotent; exit 1 if an anchor is missing
"""

from __future__ import annotations

import sys
from pathlib import Path

NAME = "VLLM_FLASHINFER_MOE_FUSED_FINALIZE"
MARK = "fi-cache issue 22 patch (vLLM PR #54948)"
ENVS = "vllm/envs.py"
MOE = "vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py"

# (file, anchor, text inserted after the anchor); each anchor must occur exactly once.
# The call's closing lines get the keyword (CALL_END -> CALL_NEW).
EDITS: list[tuple[str, str, str]] = [
    (
        ENVS,
        "    VLLM_USE_FLASHINFER_MOE_INT4: bool = False\n",
        f"    {NAME}: bool = True  # {MARK}\n",
    ),
    (
        ENVS,
        '    "VLLM_USE_FLASHINFER_MOE_INT4": lambda: bool(\n'
        '        int(os.getenv("VLLM_USE_FLASHINFER_MOE_INT4", "0"))\n'
        "    ),\n",
        f"    # {MARK}: 0 passes use_fused_finalize=False to FlashInfer's CUTLASS fused MoE\n"
        "    # (deterministic finalize); 1 (default) keeps the fused, atomic one.\n"
        f'    "{NAME}": lambda: bool(int(os.getenv("{NAME}", "1"))),\n',
    ),
    (
        MOE,
        "from vllm.logger import init_logger\n",
        f"import vllm.envs as envs  # {MARK}\n",
    ),
]
CALL_END = "            use_w4_group_scaling=use_w4_group_scaling,\n        )\n"
CALL_NEW = (
    "            use_w4_group_scaling=use_w4_group_scaling,\n"
    f"            use_fused_finalize=envs.{NAME},  # {MARK}\n"
    "        )\n"
)
IGNORED_ANCHOR = '        "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS",\n'


def _once(text: str, anchor: str, path: Path) -> int:
    n = text.count(anchor)
    if n != 1:
        sys.exit(f"{path}: anchor found {n} times, expected 1: {anchor.splitlines()[0]!r}")
    return text.index(anchor) + len(anchor)


def patch(site: Path, unhashed: bool) -> list[str]:
    done: list[str] = []
    texts = {rel: (site / rel).read_text() for rel in (ENVS, MOE)}
    if MARK in texts[ENVS] or MARK in texts[MOE]:
        return ["already patched"]  # idempotent: a second install step changes nothing
    for rel, anchor, insert in EDITS:
        at = _once(texts[rel], anchor, site / rel)
        texts[rel] = texts[rel][:at] + insert + texts[rel][at:]
        done.append(f"{rel}: +{insert.count(chr(10))} after {anchor.splitlines()[0].strip()!r}")
    _once(texts[MOE], CALL_END, site / MOE)
    texts[MOE] = texts[MOE].replace(CALL_END, CALL_NEW)
    done.append(f"{MOE}: use_fused_finalize=envs.{NAME} in flashinfer_cutlass_fused_moe(...)")
    if unhashed:
        at = _once(texts[ENVS], IGNORED_ANCHOR, site / ENVS)
        line = f'        "{NAME}",  # {MARK}: --unhashed\n'
        texts[ENVS] = texts[ENVS][:at] + line + texts[ENVS][at:]
        done.append(f"{ENVS}: {NAME} in compile_factors' ignored_factors (--unhashed)")
    for rel, text in texts.items():
        (site / rel).write_text(text)
        for pyc in (site / rel).parent.glob(f"__pycache__/{Path(rel).stem}.*.pyc"):
            pyc.unlink()  # a stale bytecode file would hide the edit
    return done


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--unhashed"]
    if len(args) != 1:
        sys.exit(__doc__)
    for line in patch(Path(args[0]), "--unhashed" in sys.argv[1:]):
        print("patch:", line)
