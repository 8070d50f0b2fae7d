"""`python -m fi_cache.tune`: the tuning child. Reads a job (JSON) on stdin, runs it, and writes
events (JSON lines) on stdout; see fi_cache/tune/driver.py."""

from __future__ import annotations

import json
import sys

from fi_cache.tune.driver import EXIT_REFUSED, Job, run


def main() -> int:
    events = sys.stdout
    sys.stdout = sys.stderr  # anything FlashInfer prints must not break the event stream

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
