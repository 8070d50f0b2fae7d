"""fi-cache's vLLM general plugin: unfused (deterministic) MoE finalize on a vLLM release.

FlashInfer >= 0.7.4 runs its CUTLASS fused MoE with unfused finalize when the caller passes no
`use_fused_finalize` and torch's deterministic algorithms are on; vLLM releases pass none
(fi_cache/versions: "Unfused MoE finalize on vLLM"). vLLM calls `register` in every process it
starts (API server, engine core, each worker). It does nothing unless FI_CACHE_DETERMINISTIC is
set, which fi-cache's launch sets for `serve --deterministic` and `warm --finalize unfused`:
"strict" turns torch's deterministic algorithms on as torch defines them (an op without a
deterministic kernel raises); any other value but "0" warn-only, and without torch's fill of
uninitialised memory (a NaN fill after every torch.empty: a cost, not a determinism gain here).

Standard library only at import: this file is also carried alone on PYTHONPATH (no fi_cache).
"""

from __future__ import annotations

import os

ENV = "FI_CACHE_DETERMINISTIC"  # fi_cache.versions.PLUGIN_ENV


def register() -> None:
    mode = os.environ.get(ENV, "")
    if mode in ("", "0"):
        return
    import torch  # only when asked: vLLM imports every plugin in every process

    strict = mode == "strict"
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    if not strict:
        import torch.utils.deterministic

        torch.utils.deterministic.fill_uninitialized_memory = False
