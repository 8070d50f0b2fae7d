"""Where doctor's inputs come from, one module per source: the cache files (store, vLLM's dir,
PATHs), vLLM's prediction of its cache, a running or planned SGLang, and logs. gather.py puts
them together; the checks never read anything themselves."""
