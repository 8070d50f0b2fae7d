"""Rank files of one deployment: which files each engine's ranks read and write (layout), whether
the engine will keep and hit them (agreement: vLLM's unanimity gate, SGLang's digest), and how to
make them agree without losing an entry (align). Pure: data in, data out."""
