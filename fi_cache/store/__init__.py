"""The fi-cache store on disk, and the only package that writes to disk.

`paths.py` (where the store is), `namespace.py` (one dir per environment and finalize mode),
`manifest.py` (a namespace's record of warms), `files.py` (atomic writes), `locks/` (namespace
locks: flock and lock-file strategies behind one interface; serve's in-use marks), `trash.py`
(deleting by one rename), `quarantine.py` (doctor --fix moves files aside), `install.py`
(imported namespaces swapped in whole). Engines (vLLM, FlashInfer's tuner) write their own cache
files into a namespace, under its lock, with their own temp file + rename.
"""
