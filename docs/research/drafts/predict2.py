import json, sys, types, collections, itertools
argv = json.loads(sys.argv[1]); target = sys.argv[2]
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
import vllm
top = FlexibleArgumentParser(); sub = top.add_subparsers(); ServeSubcommand().subparser_init(sub)
args = top.parse_args(["serve", *argv])
if getattr(args, "model_tag", None): args.model = args.model_tag
from vllm.usage.usage_lib import UsageContext
cfg = vllm.AsyncEngineArgs.from_cli_args(args).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
from vllm.model_executor.warmup.flashinfer_autotune_cache import flashinfer_autotune_cache_hash as H
h = lambda: H(types.SimpleNamespace(vllm_config=cfg))
print("base", h() == target)
cc, co = cfg.cache_config, cfg.compilation_config
sets = {
 "kv_cache_layout": lambda: setattr(cc, "kv_cache_layout", "LBHNC"),
 "hash_block_size": lambda: setattr(cc, "hash_block_size", 128),
 "cache_hit_alignment_tokens": lambda: setattr(cc, "cache_hit_alignment_tokens", 128),
 "num_gpu_blocks": lambda: setattr(cc, "num_gpu_blocks", 16384),
 "disabled_custom_ops": lambda: setattr(co, "disabled_custom_ops", collections.Counter({'rms_norm': 9, 'unquantized_fused_moe': 2, 'rotary_embedding': 1, 'apply_rotary_emb': 1})),
 "static_all_moe_layers": lambda: setattr(co, "static_all_moe_layers", ['model.layers.0.mlp.experts', 'model.layers.1.mlp.experts']),
}
for k, fn in sets.items():
    fn(); print(k, "->", h() == target, cfg.cache_config.compute_hash()[:8], cfg.compilation_config.compute_hash()[:8])
