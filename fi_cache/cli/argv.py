"""Command lines that carry vLLM's (`fi-cache serve [OPTIONS] [--] VLLM_SERVE_ARGS...`), and the
global options (--store, --format, -q) after any command name too.

serve and warm read their own options up to the first word that is not one of them; that word
and everything after it are vLLM's, unchanged (a `--` there is dropped), so `fi-cache serve` can
stand in front of a `vllm serve` line. One of fi-cache's own options met later is refused rather
than taken: a vLLM flag of that name would otherwise be stolen silently, and passed on it would
make vLLM exit with "unrecognized arguments" only after a warm had started.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fi_cache.errors import Refused

# Names that are flags of `vllm serve` as well (the serve parsers of vLLM 0.32 and 0.33: -q is
# --quantization, -h/--help, --port). After the split they are vLLM's. No other option name of
# serve or warm is a vLLM flag, or a prefix argparse would expand into one (allow_abbrev).
VLLM_NAMES = frozenset({"-q", "-h", "--help", "--port"})


def _set_store(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None and ctx.obj is not None:
        from fi_cache.store.paths import checked_store

        ctx.obj.store = checked_store(value)


def _set_format(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None and ctx.obj is not None:
        ctx.obj.json = value == "json"


def _set_quiet(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and ctx.obj is not None:
        ctx.obj.quiet = True


def global_options(short_quiet: bool) -> list[click.Option]:
    """The group's options, accepted after a command name too (`fi-cache doctor -q`); hidden
    from each command's help, which the group's help covers. `short_quiet=False` for serve and
    warm, where `-q` is vLLM's."""
    quiet = ["-q", "--quiet"] if short_quiet else ["--quiet"]
    common: dict[str, Any] = {"expose_value": False, "hidden": True}
    return [
        click.Option(
            ["--store"],
            type=click.Path(path_type=Path, readable=False),
            callback=_set_store,
            **common,
        ),
        click.Option(
            ["--format", "fmt"],
            type=click.Choice(["human", "json"]),
            callback=_set_format,
            **common,
        ),
        click.Option(quiet, is_flag=True, callback=_set_quiet, **common),
    ]


def split(args: list[str], takes_value: dict[str, bool]) -> tuple[list[str], list[str], bool]:
    """(fi-cache's words, vLLM's words, whether a `--` separated them). `takes_value` maps each of
    fi-cache's option names to whether it takes a value."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[:i], args[i + 1 :], True
        name, eq, _ = arg.partition("=")
        if name not in takes_value or (eq and not takes_value[name]):
            break
        i += 2 if takes_value[name] and not eq else 1
    return args[:i], args[i:], False


def misspelled(theirs: list[str], ours_only: set[str]) -> tuple[str, str] | None:
    """(the word, the fi-cache option it is close to) when the word that ended fi-cache's options
    looks like a misspelling of one of them, so that nothing starts for it. No flag of `vllm
    serve` 0.32 (430 names) is that close to one of fi-cache's (tests/cli/test_argv.py)."""
    if not theirs or not theirs[0].startswith("--"):
        return None
    word = theirs[0].partition("=")[0]
    longs = sorted(o for o in ours_only if o.startswith("--"))
    import difflib

    close = difflib.get_close_matches(word.replace("_", "-"), longs, n=1, cutoff=0.8)
    return (word, close[0]) if close else None


def misplaced(theirs: list[str], ours_only: set[str]) -> str | None:
    """The first of fi-cache's own options among vLLM's words (up to a `--` of theirs)."""
    for arg in theirs:
        if arg == "--":
            return None
        if (name := arg.partition("=")[0]) in ours_only:
            return name
    return None


class VllmCommand(click.Command):
    """A command whose trailing words are a `vllm serve` command line (see the module doc)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value: dict[str, bool] = {}
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                for opt in (*param.opts, *param.secondary_opts):
                    takes_value[opt] = not (param.is_flag or param.count)
        ours, theirs, explicit = split(args, takes_value)
        if not explicit and (guess := misspelled(theirs, set(takes_value) - VLLM_NAMES)):
            word, meant = guess
            raise Refused(
                f"{word} is not an option of `{ctx.command_path}`: did you mean {meant}? (for a "
                f"word of the engine's that looks like it, put it after `--`)"
            )
        name = None if explicit else misplaced(theirs, set(takes_value) - VLLM_NAMES)
        if name is not None:
            raise Refused(
                f"{name} comes after the vLLM arguments, where fi-cache reads none of its "
                f"options: put it first (`{ctx.command_path} {name} ... MODEL ...`), or after "
                "`--` to hand it to vLLM"
            )
        return super().parse_args(ctx, [*ours, "--", *theirs] if theirs else ours)
