"""A tiny Qwen3-MoE model dir: config from transformers, a word-level tokenizer, no weights."""
import json, sys
from pathlib import Path
from transformers import Qwen3MoeConfig
from tokenizers import Tokenizer, models, pre_tokenizers
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
words = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(252)]
cfg = Qwen3MoeConfig(vocab_size=len(words), hidden_size=128, intermediate_size=128, moe_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_experts=8,
    num_experts_per_tok=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=3,
    torch_dtype="bfloat16")
cfg.architectures = ["Qwen3MoeForCausalLM"]
cfg.save_pretrained(out)
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save(str(out / "tokenizer.json"))
(out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
    "unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "model_max_length": 512}))
print(out)
