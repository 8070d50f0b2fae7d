"""The options several commands share, declared once: one spelling, one help text, one type
(tests/cli/test_options.py walks every command and holds them to it), and the typed context every
command reads the global options from."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from click.core import ParameterSource

from fi_cache.errors import Refused

if TYPE_CHECKING:
    from fi_cache.cli import Context

F = TypeVar("F", bound=Callable[..., Any])


def context() -> Context:
    """What the global options say (--store, --format, -q), for the command now running."""
    obj = click.get_current_context().obj
    assert obj is not None, "a command runs under the fi-cache group"
    return obj  # type: ignore[no-any-return]


def given(*names: str) -> list[str]:
    """The options among `names` (parameter names) that the command line set, as spelled in
    --help: what a refusal names."""
    ctx = click.get_current_context()
    params = {p.name: p for p in ctx.command.params}
    out = []
    for name in names:
        source = ctx.get_parameter_source(name)
        if source is not None and source not in (
            ParameterSource.DEFAULT,
            ParameterSource.DEFAULT_MAP,
        ):
            param = params[name]
            out.append(
                param.opts[0] if isinstance(param, click.Option) else param.human_readable_name
            )
    return out


def refuse_ignored(where: str, *names: str) -> None:
    """Refuse (exit 2, one line) options the command would otherwise accept and ignore."""
    if found := given(*names):
        raise Refused(f"{', '.join(found)} {'does' if len(found) == 1 else 'do'} not apply {where}")


def refuse_under_json(name: str, why: str) -> None:
    """Refuse (exit 2, one line) an option that only shapes human output when --format json is
    asked: the JSON document is the same with or without it."""
    if context().json and (found := given(name)):
        raise Refused(f"{found[0]} does not apply with --format json: {why}")


# What each shared option means. A command's own default goes in its show_default, never in the
# help text, so that the text is the same on every command.
FINALIZE_HELP = (
    "MoE finalize mode, hence the namespace: fused, or unfused (bit-stable, deterministic)."
)
DRY_RUN_HELP = "Print what would be done; change nothing."
TIMEOUT_HELP = (
    "Seconds the work may take before it fails: the engine's /health (warm, serve), one mode's "
    "tuning (warm --engine flashinfer), the whole re-timing (bench)."
)
LOCK_TIMEOUT_HELP = "Seconds to wait for another warm of the same namespace (or GPU) to finish."
NAMESPACE_HELP = (
    "here, fused, unfused (this machine's namespaces) or a namespace dir "
    "(absolute, or relative to the store or its namespaces/)."
)
FINALIZE_CHOICE = click.Choice(["fused", "unfused"])
SECONDS = click.FloatRange(min=0, min_open=True)
LOCK_SECONDS = click.FloatRange(min=0)
LOCK_TIMEOUT_DEFAULT = 3600.0


def finalize(show_default: str | bool = False) -> Callable[[F], F]:
    """`--finalize fused|unfused` (not given: None; the command's default is `show_default`)."""
    return click.option(
        "--finalize",
        type=FINALIZE_CHOICE,
        default=None,
        show_default=show_default,
        help=FINALIZE_HELP,
    )


def dry_run() -> Callable[[F], F]:
    """`--dry-run`: the plan printed, nothing written, no lock taken."""
    return click.option("--dry-run", is_flag=True, help=DRY_RUN_HELP)


def timeout(default: float | None, show_default: str | bool = True) -> Callable[[F], F]:
    """`--timeout SECONDS`: how long the work may take."""
    return click.option(
        "--timeout",
        type=SECONDS,
        default=default,
        show_default=show_default,
        metavar="SECONDS",
        help=TIMEOUT_HELP,
    )


def lock_timeout() -> Callable[[F], F]:
    """`--lock-timeout SECONDS`: how long to wait for another warm's lock."""
    return click.option(
        "--lock-timeout",
        type=LOCK_SECONDS,
        default=LOCK_TIMEOUT_DEFAULT,
        show_default=True,
        metavar="SECONDS",
        help=LOCK_TIMEOUT_HELP,
    )


def namespace_option(show_default: str | bool = False) -> Callable[[F], F]:
    """`--namespace NS`: the spelling every command accepts (export, pin and unpin also take it
    as their first argument, as before)."""
    return click.option(
        "--namespace",
        "namespace_opt",
        metavar="NAMESPACE",
        default=None,
        show_default=show_default,
        help=NAMESPACE_HELP,
    )


def one_namespace(positional: str | None, option: str | None) -> str | None:
    """NAMESPACE given as the argument or as --namespace (both, differing: refused)."""
    if positional is not None and option is not None and positional != option:
        raise Refused(f"NAMESPACE {positional!r} and --namespace {option!r}: give one")
    return positional if positional is not None else option
