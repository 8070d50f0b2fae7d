"""The `fi-cache` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import codecs
import io
import sys
from pathlib import Path

import click

from fi_cache import __version__
from fi_cache.errors import EXIT_REFUSED, FiCacheError


class Context:
    """What the group's options say, for every command (a plain class: dataclasses costs
    `fi-cache --help` 5 ms)."""

    __slots__ = ("json", "quiet", "store")

    def __init__(self, store: Path, json: bool, quiet: bool) -> None:
        self.store, self.json, self.quiet = store, json, quiet


# Every command: its module and the first paragraph of its help, so that `fi-cache --help` lists
# them without importing them and a command imports only its own module (tests/cli/
# test_main_cli.py holds these to the commands' own help).
COMMANDS: dict[str, tuple[str, str]] = {
    "align": (
        "align",
        "Give every rank of a deployment the same file: the union of its ranks' entries.",
    ),
    "bench": ("bench", "Re-time CACHE's entries on this GPU against FlashInfer's default tactic."),
    "coverage": (
        "coverage",
        "Say which (op, bucket) pairs of a plan or a start's log CACHE has tuned, and why not.",
    ),
    "diff": (
        "diff",
        "Compare two caches: keys only in one, keys with another runner or tactic, _metadata.",
    ),
    "doctor": (
        "doctor",
        "Check the store, PATHS and logs against the target environment [-- VLLM_SERVE_ARGS].",
    ),
    "env": ("env", "Show the detected environment and the namespace dir of each finalize mode."),
    "evict": (
        "evict",
        "Remove the entries that match every option given from the v1 caches under PATHS.",
    ),
    "export": (
        "bundle",
        "Bundle NAMESPACE (a dir, or fused/unfused/here for this machine's; default: all).",
    ),
    "import": ("bundle", "Verify BUNDLE completely, then install its namespaces into the store."),
    "ls": (
        "ls",
        "List caches in the store, FlashInfer's v2 root, vLLM's default cache dir "
        "($VLLM_CACHE_ROOT/flashinfer_autotune_cache) and PATHS (files, vLLM roots, v2 "
        "stores).",
    ),
    "merge": (
        "merge",
        "Union of v1 cache files with equal _metadata into OUT; conflicts are reported.",
    ),
    "pin": (
        "pin",
        "Pin NAMESPACE (a namespace dir, or fused/unfused/here for this machine's): no "
        "start may change it.",
    ),
    "plan": ("plan", "Write a tuning plan from a model's config.json, or check one."),
    "prune": (
        "prune",
        "Delete namespaces of the store; temp files of killed writers (older than "
        "10 minutes) always.",
    ),
    "pull": (
        "push_pull",
        "Download this machine's bundle from URL, check its sha256, verify and import it.",
    ),
    "push": (
        "push_pull",
        "Upload this machine's namespaces as a bundle to URL (s3://, gs://, file://, a path, ...).",
    ),
    "serve": (
        "serve",
        "Run `vllm serve VLLM_SERVE_ARGS` (--engine sglang: `sglang serve "
        "SGLANG_ARGS`) on this machine's namespace, warmed first when cold.",
    ),
    "show": (
        "show",
        "Decode one cache: metadata, entries by op with shapes and tactics, MoE extras by name.",
    ),
    "unpin": (
        "pin",
        "Unpin NAMESPACE: its files and dirs get their modes back; starts may change it again.",
    ),
    "verify": (
        "verify",
        "Check integrity: valid JSON, every key parses, `_generation` matches, value shapes.",
    ),
    "warm": (
        "warm",
        "Fill this machine's namespace: `vllm serve VLLM_SERVE_ARGS` until healthy, "
        "or (--engine sglang) `sglang serve SGLANG_ARGS`, or (--engine flashinfer --plan "
        "PLAN) FlashInfer's autotuner on the plan's ops, without a serving engine or "
        "weights.",
    ),
}


class _LazyGroup(click.Group):
    """Commands imported when they run, listed from COMMANDS (click's "lazily loading
    subcommands" pattern): `fi-cache --help` imports no command module."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            _load(COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [
            (name, click.Command(name, help=COMMANDS[name][1]).get_short_help_str(limit))
            for name in sorted(COMMANDS)
        ]  # click's own shortening, as for a loaded command
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="\b\nExamples:\n  fi-cache ls\n  fi-cache doctor\n"
    "  fi-cache serve -- Qwen/Qwen3-30B-A3B --port 8000",
)
@click.option(
    "--store",
    type=click.Path(path_type=Path, readable=False),
    default=None,
    help="fi-cache store dir (default: $FI_CACHE_DIR, else the user cache dir).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["human", "json"]),
    default="human",
    show_default=True,
    help="json: one JSON document on stdout, text on stderr.",
)
@click.option(
    "-q",
    "--quiet",
    is_flag=True,
    help="No progress, notes or warnings on stderr (errors still); results on stdout stay.",
)
@click.version_option(__version__, prog_name="fi-cache")
@click.pass_context
def cli(ctx: click.Context, store: Path | None, fmt: str, quiet: bool) -> None:
    """Namespace, inspect, verify and diagnose FlashInfer autotune caches for vLLM.

    The global options work after the command name too (`fi-cache doctor -q`); after `serve`
    and `warm`, where `-q` is vLLM's --quantization, as --quiet.
    """
    from fi_cache.store.paths import checked_store, default_store

    store = checked_store(default_store() if store is None else store)
    ctx.obj = Context(store=store, json=fmt == "json", quiet=quiet)


def _load(module_name: str) -> None:
    """Register the commands of one cli module (one command, or a tight pair), each with the
    global options it also takes after its name."""
    import importlib

    from fi_cache.cli import argv

    module = importlib.import_module(f"fi_cache.cli.{module_name}")
    for command in module.COMMANDS:
        if command.name in cli.commands:
            continue
        short_quiet = not isinstance(command, argv.VllmCommand)
        command.params.extend(argv.global_options(short_quiet))
        cli.add_command(command)


def load_all() -> dict[str, click.Command]:
    """Every command, loaded (tests, and whatever needs them all)."""
    for module_name in sorted({m for m, _ in COMMANDS.values()}):
        _load(module_name)
    return dict(cli.commands)


def _wants_json(argv: list[str]) -> bool:
    """Did the global options ask for JSON? (Read from argv: the failure may precede parsing.)"""
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        if arg == "--format=json" or (arg == "--format" and argv[i + 1 : i + 2] == ["json"]):
            return True
    return False


def _json_error(argv: list[str] | None, message: str, path: str | None, code: int) -> None:
    """Scripts asking for JSON still get exactly one JSON document on stdout."""
    if _wants_json(argv if argv is not None else sys.argv[1:]):
        import json

        click.echo(json.dumps({"error": {"message": message, "path": path, "exit_code": code}}))


def _escape_unencodable(exc: UnicodeError) -> tuple[str | bytes, int]:
    """Bytes of a file name that were not UTF-8 (`\\udcff` after os.fsdecode) go out as they
    came; any other character the stream cannot encode goes out escaped, not as a traceback."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    try:
        return codecs.lookup_error("surrogateescape")(exc)
    except UnicodeError:
        return codecs.lookup_error("backslashreplace")(exc)


codecs.register_error("fi-cache-escape", _escape_unencodable)


def _printable_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="fi-cache-escape")


def said(exc: FiCacheError, argv: list[str] | None) -> int:
    """A failure's one line on stderr (and its JSON document when asked for): its exit code."""
    click.echo(f"fi-cache: {exc}", err=True)
    _json_error(argv, exc.message, exc.path, exc.exit_code)
    return exc.exit_code


def main(argv: list[str] | None = None) -> None:
    """Console entry point: one line on stderr and a documented exit code for every failure."""
    _printable_streams()
    try:
        code = cli.main(args=argv, prog_name="fi-cache", standalone_mode=False)
    except click.exceptions.ClickException as exc:
        exc.show()
        code = exc.exit_code
        _json_error(argv, exc.format_message(), None, code)
    except click.exceptions.Abort:
        click.echo("fi-cache: interrupted", err=True)  # click turns Ctrl-C into Abort
        code = 130
    except FiCacheError as exc:
        code = said(exc, argv)
    except KeyboardInterrupt:
        click.echo("fi-cache: interrupted", err=True)
        code = 130
    except BrokenPipeError:
        code = 0  # `fi-cache ls | head` is fine
    except RecursionError:
        click.echo("fi-cache: input nested too deeply to process", err=True)
        code = EXIT_REFUSED
        _json_error(argv, "input nested too deeply to process", None, code)
    except OSError as exc:  # last resort: an unreadable dir met somewhere unexpected
        where = f"{exc.filename}: " if exc.filename else ""
        click.echo(f"fi-cache: {where}{exc.strerror or exc}", err=True)
        code = EXIT_REFUSED
        _json_error(argv, str(exc.strerror or exc), exc.filename, code)
    sys.exit(code if isinstance(code, int) else 0)
