"""The vLLM engine: `args.py` (what fi-cache reads from `vllm serve` arguments), `launch.py`
(finding, starting and stopping vLLM), `warm.py` (one warm), `logs.py` (vLLM's log lines),
`engine.py` (the engines contract)."""
