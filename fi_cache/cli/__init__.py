"""The `fi-cache` command line: parse, call the library, render. Nothing else lives here."""

from __future__ import annotations

import codecs
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from fi_cache import __version__
from fi_cache.errors import EXIT_REFUSED, FiCacheError


@dataclass
class Context:
    store: Path
    json: bool
    quiet: bool


@click.group(
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
    if store is None:
        from fi_cache.store.paths import default_store

        store = default_store()
    # Absolute and symlink-free, so paths inside the store compare equal however they were spelled.
    ctx.obj = Context(store=store.expanduser().resolve(), json=fmt == "json", quiet=quiet)


def _register() -> None:
    from fi_cache.cli import (
        align,
        argv,
        bundle,
        doctor,
        env,
        ls,
        merge,
        plan,
        prune,
        push_pull,
        serve,
        show,
        verify,
        warm,
    )

    # One module per command (or tight pair); click lists them by name.
    modules = [env, ls, show, verify, doctor, warm, serve, plan, prune, merge, align, bundle]
    modules.append(push_pull)
    for command in [c for m in modules for c in m.COMMANDS]:
        short_quiet = not isinstance(command, argv.VllmCommand)
        command.params.extend(argv.global_options(short_quiet))
        cli.add_command(command)


_register()


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
        click.echo(f"fi-cache: {exc}", err=True)
        code = exc.exit_code
        _json_error(argv, exc.message, exc.path, code)
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
