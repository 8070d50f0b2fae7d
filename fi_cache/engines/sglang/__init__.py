"""SGLang: what fi-cache reads from its command line (args.py). No launch yet (docs/sglang.md)."""
