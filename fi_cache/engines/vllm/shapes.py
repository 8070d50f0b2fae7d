"""What in `vllm serve` arguments changes the ops and shapes FlashInfer tunes (beyond the token
buckets, which model/sweep.py judges): the sharding (tensor, pipeline, data and expert
parallel sizes split the GEMMs' and the MoE's dims), the dtypes and quantisation (other ops, other
key extras), the MoE and all2all backends, and a drafter (its own model's ops). Two starts of one
model that differ here tune tables no seed from one gives the other in full. Pure."""

from __future__ import annotations

from fi_cache.engines.vllm.args import ServeArgs, vllm_spelling

# Flags whose value changes what is tuned, by vLLM's spelling (`-q` is --quantization's short form).
_SHAPE_FLAGS = {
    "--dtype": "--dtype",
    "--quantization": "--quantization",
    "-q": "--quantization",
    "--kv-cache-dtype": "--kv-cache-dtype",
    "--speculative-config": "--speculative-config",
    "--hf-overrides": "--hf-overrides",
}


def shaping(a: ServeArgs) -> tuple[object, ...]:
    """What must be equal for one start's table to hold every op and shape of another's."""
    values: dict[str, str | None] = {}
    for i, arg in enumerate(a.argv):
        name, eq, inline = arg.partition("=")
        flag = _SHAPE_FLAGS.get(vllm_spelling(name))
        if flag is not None:  # the last one given wins, as in vLLM's parser
            values[flag] = inline if eq else (a.argv[i + 1] if i + 1 < len(a.argv) else None)
    sharding = (a.tp, a.pp, a.dp, a.expert_parallel, a.moe_backend, a.all2all_backend)
    return (*sharding, tuple(sorted(values.items())))
