"""fi-cache's vLLM general plugin (fi_cache_vllm_plugin.py) and the directory a launch puts on
vLLM's PYTHONPATH to carry it where fi-cache is not installed in vLLM's Python: the module and a
dist-info naming its `vllm.general_plugins` entry point, nothing else. Imports nothing."""
