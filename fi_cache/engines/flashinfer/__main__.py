"""`python -m fi_cache.engines.flashinfer`: the tuning child. Reads a job (JSON) on stdin, runs
it, and writes events (JSON lines) on stdout; see driver.py beside this file."""

from __future__ import annotations

import json
import os
import sys

from fi_cache.engines.flashinfer.driver import EXIT_REFUSED, Job, run


def main() -> int:
    # Events get a private copy of fd 1; fd 1 itself becomes stderr, so whatever Python or native
    # code prints (TensorRT-LLM's C++ logger writes to std::cout) cannot break the event stream.
    sys.stdout.flush()
    events = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def emit(event: dict[str, object]) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    def receive() -> dict[str, object]:
        line = sys.stdin.readline()
        try:
            data = json.loads(line) if line.strip() else {}
        except ValueError:
            data = {}
        return data if isinstance(data, dict) else {}

    try:
        job = Job.from_json(receive())
    except (ValueError, KeyError, TypeError) as exc:
        emit({"event": "error", "kind": "job", "message": f"bad job on stdin: {exc!r}"})
        return EXIT_REFUSED
    return run(job, emit, receive)


if __name__ == "__main__":
    sys.exit(main())
