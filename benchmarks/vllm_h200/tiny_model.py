"""A 2-layer Qwen3-MoE model dir with Qwen3-30B-A3B's shapes, for real vLLM on one H200.

    python3 tiny_model.py DIR

Config and tokenizer only (vLLM serves it with `--load-format dummy`: no weights are read,
nothing is downloaded). Shapes from tests/fixtures/hf/qwen3-30b-a3b.json: hidden 2048,
moe_intermediate_size 768, 128 experts, top-8, 32 heads of 128, 4 KV heads; so the CUTLASS fused
MoE tunes the same GEMMs as the real model. Only the depth (2 layers) and the vocabulary (256
words, word-level) are cut. Needs
transformers and tokenizers (both on the GPU machine's image).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import Qwen3MoeConfig

WORDS = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(252)]
REAL = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "hf" / "qwen3-30b-a3b.json"
SHAPES = {  # Qwen3-30B-A3B (the fixture above); checked against it by check_shapes()
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
}


def check_shapes() -> None:
    # The fixture is not on the GPU machine when only this file travels; skip the check there.
    if REAL.exists():
        real = json.loads(REAL.read_text())
        wrong = {k: (v, real[k]) for k, v in SHAPES.items() if real[k] != v}
        assert not wrong, wrong


def build(out: Path) -> Path:
    check_shapes()
    out.mkdir(parents=True, exist_ok=True)
    config = Qwen3MoeConfig(
        vocab_size=len(WORDS),
        num_hidden_layers=2,
        max_position_embeddings=4096,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        **SHAPES,
    )
    config.architectures = ["Qwen3MoeForCausalLM"]
    config.dtype = "bfloat16"  # transformers 5 writes "dtype" (4.x read "torch_dtype")
    config.save_pretrained(out)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(out / "tokenizer.json"))
    special = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    fast = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    (out / "tokenizer_config.json").write_text(json.dumps({**fast, **special}))
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
