"""vLLM's log line prefix, which doctor's log reading (fi_cache/doctor/logs.py) needs to tell
when and in which process a FlashInfer message was printed."""

from __future__ import annotations

import re

# "INFO 11-30 02:00:00 [kernel_warmup.py:42]": month-day, no year (groups: month, day, h, m, s).
STAMP = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)"
# "(EngineCore_DP0 pid=123)": the process a line came from.
PROCESS = re.compile(r"pid=(\d+)")

# Lines that name the autotune file a start read or wrote: vLLM's own (kernel_warmup.py 0.32:460
# "Using FlashInfer autotune cache file: %s") and FlashInfer's load/save lines (autotuner.py).
CACHE_FILE_LINE = re.compile(
    r"(?:Using FlashInfer autotune cache file: |\[Auto[Tt]uner\]: (?:Loaded|Saved) \d+ configs "
    r"(?:from|to) )(\S+)"
)


def named_cache_file(line: str) -> str | None:
    """The path a vLLM/FlashInfer log line says this start used, if any."""
    m = CACHE_FILE_LINE.search(line)
    return m.group(1) if m else None
