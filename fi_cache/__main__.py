"""`python -m fi_cache` and the `fi-cache` console script. A serve first tries its memo
(lifecycle/serve_memo/): an unchanged repeat hands over to the engine before the CLI, click or
any check is imported; any other serve is recorded from here on, imports included."""

from __future__ import annotations

import os
import sys

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False

if TYPE_CHECKING:
    from fi_cache.lifecycle.serve_memo.replay import Hit


def main() -> None:
    argv = sys.argv[1:]
    if "serve" in argv:
        from fi_cache.lifecycle import serve_memo

        if serve_memo.enabled(os.environ):
            from fi_cache.lifecycle.serve_memo import replay

            if (hit := replay.lookup(argv, os.environ)) is not None:
                _replay(hit, argv)
            from fi_cache.lifecycle.serve_memo import record

            record.record(argv)
    from fi_cache.cli import main as cli_main

    cli_main()


def _replay(hit: Hit, argv: list[str]) -> None:
    """What the recorded serve printed, then its hand-over (cli/serve.py's, replayed). Exits."""
    from fi_cache.lifecycle import serve_memo
    from fi_cache.lifecycle.serve_memo import replay

    for stream, data in ((sys.stderr, hit.err), (sys.stdout, hit.out)):
        stream.flush()
        stream.buffer.write(data)
        stream.buffer.flush()
    if hit.stdout_to_stderr:
        os.dup2(2, 1)
    if serve_memo.explains(os.environ):
        sys.stderr.write("fi-cache: serve memo: replayed (nothing it read has changed)\n")
        sys.stderr.flush()
    failed = replay.hand_over(hit)
    # As the full serve would end here (lifecycle/serve.hand_over's refusal), not a second serve.
    from fi_cache.cli import said
    from fi_cache.errors import Refused

    exc = Refused(f"cannot run {hit.display}: {failed.strerror}", hit.command[0])
    sys.exit(said(exc, argv))


if __name__ == "__main__":
    main()
