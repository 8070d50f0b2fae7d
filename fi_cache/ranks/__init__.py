"""Rank files of one deployment: which files each engine's ranks read and write (layout), whether
the engine will keep and hit them (agreement: vLLM's unanimity gate, SGLang's digest), and how to
make them agree without losing an entry (align). Pure: data in, data out."""

# The most ranks fi-cache reasons about: no real TP/EP/DP world comes near it, and rank numbers
# past it (a stray file name) are not inferred from; a plan of one op per rank stays ~1 MB.
MAX_RANKS = 4096
