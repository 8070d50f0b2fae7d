"""`python -m fi_cache` and the `fi-cache` console script. A serve first tries its memo
(lifecycle/serve_memo.py): an unchanged repeat hands over to the engine before the CLI, click
or any check is imported; any other serve is recorded from here on, imports included."""

from __future__ import annotations

import os
import sys

# typing costs serve's memo path 3 ms; mypy reads this name as typing's
TYPE_CHECKING = False

if TYPE_CHECKING:
    from fi_cache.lifecycle import serve_memo


def main() -> None:
    argv = sys.argv[1:]
    if "serve" in argv:
        from fi_cache.lifecycle import serve_memo

        if serve_memo.enabled(os.environ):
            if (hit := serve_memo.lookup(argv, os.environ)) is not None:
                _replay(hit)  # returns only when the engine could not be exec'd
            serve_memo.record(argv)
    from fi_cache.cli import main as cli_main

    cli_main()


def _replay(hit: serve_memo.Hit) -> None:
    """What the recorded serve printed, then its hand-over (cli/serve.py's, replayed)."""
    from fi_cache.lifecycle import serve_memo

    for stream, data in ((sys.stderr, hit.err), (sys.stdout, hit.out)):
        stream.flush()
        stream.buffer.write(data)
        stream.buffer.flush()
    if hit.stdout_to_stderr:
        os.dup2(2, 1)
    if serve_memo.explains(os.environ):
        sys.stderr.write("fi-cache: serve memo: replayed (nothing it read has changed)\n")
        sys.stderr.flush()
    serve_memo.hand_over(hit)


if __name__ == "__main__":
    main()
