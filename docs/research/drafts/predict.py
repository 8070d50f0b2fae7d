"""Prototype: in vLLM's own interpreter, the autotune cache file vLLM would use for `vllm serve ARGV`."""
import json, sys, types
argv = json.loads(sys.argv[1])
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import ServeSubcommand
import vllm
top = FlexibleArgumentParser()
sub = top.add_subparsers()
ServeSubcommand().subparser_init(sub)
args = top.parse_args(["serve", *argv])
if getattr(args, "model_tag", None):
    args.model = args.model_tag
from vllm.usage.usage_lib import UsageContext
ea = vllm.AsyncEngineArgs.from_cli_args(args)
cfg = ea.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
from vllm.model_executor.warmup.flashinfer_autotune_cache import flashinfer_autotune_cache_hash
print(json.dumps({"hash": flashinfer_autotune_cache_hash(types.SimpleNamespace(vllm_config=cfg)),
                  "dp": cfg.parallel_config.data_parallel_rank, "parts": __import__("fi_cache_parts").parts(cfg)}))
