"""A tiny Qwen3-MoE model dir for real vLLM on CPU: `python tiny_model.py DIR` (run it with the
vLLM venv's python, which has transformers and tokenizers). Config and tokenizer only; vLLM
serves it with `--load-format dummy`, so nothing is downloaded and no weights are read.
head_dim 32: vLLM 0.32's CPU attention rejects 16 at the first request."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Qwen3MoeConfig

WORDS = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(252)]


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3MoeConfig(
        vocab_size=len(WORDS),
        hidden_size=128,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        torch_dtype="bfloat16",
    )
    config.architectures = ["Qwen3MoeForCausalLM"]
    config.save_pretrained(out)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    fast = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 512}
    (out / "tokenizer_config.json").write_text(json.dumps({**fast, **special}))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
