"""vLLM's log line prefix, which doctor's log reading (fi_cache/doctor/logs.py) needs to tell
when and in which process a FlashInfer message was printed (the lines that name a cache file
are engines/server.py's: FlashInfer prints them under SGLang too)."""

from __future__ import annotations

import re

# "INFO 11-30 02:00:00 [kernel_warmup.py:42]": month-day, no year (groups: month, day, h, m, s).
STAMP = r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)"
# "(EngineCore_DP0 pid=123)": the process a line came from.
PROCESS = re.compile(r"pid=(\d+)")
