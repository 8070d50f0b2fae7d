"""One lifecycle for every engine: what `warm` and `serve` do, in the order they do it.

    resolve   the engine's release, environment and finalize rule name the namespace
              (prepare.py; the notes it found are said, a mode it cannot run is refused)
    bind      what a user may not expect is said; the engine's arguments and launcher are read
    check     serve: doctor's pre-flight checks on the namespace, a read-only store (serve.py)
    seed      under the namespace lock, the file the engine will read is filled from the
              namespace's earlier files for the same model (seeding.py)
    warm      the engine runs until /health answers, is stopped, and what it wrote is recorded
              in the manifest; a concurrent warm of the same arguments is reused (warm.py)
    hand over serve: the namespace marked in use, the engine exec'd in fi-cache's place

An engine supplies only what differs (engines/api.py's ServerEngine: its command line, its
arguments, its finalize rule, its environment, what it reads and writes, "nothing to tune");
`warm --engine flashinfer` tunes a plan instead (tune.py). Nothing here prints: what the user
hears goes through a Report (report.py), which the CLI renders.
"""
