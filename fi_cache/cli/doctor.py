"""doctor: say what will break before vLLM starts, and why it broke after."""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fi_cache.cli import options, render
from fi_cache.errors import EXIT_PROBLEM, EXIT_REFUSED, Refused

if TYPE_CHECKING:
    from fi_cache.doctor.diagnose import Diagnosis
    from fi_cache.doctor.findings import Finding
    from fi_cache.doctor.fix import Action
    from fi_cache.doctor.inputs import CheckId

_COLOURS = {"error": "red", "warning": "yellow", "info": "cyan"}


class _SplitAtDoubleDash(click.Command):
    """Everything after `--` is vLLM's command line, not more PATHs."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            i = args.index("--")
            ctx.meta["vllm_args"] = args[i + 1 :]
            args = args[:i]
        else:
            ctx.meta["vllm_args"] = None
        return super().parse_args(ctx, args)


@click.command(
    "doctor",
    cls=_SplitAtDoubleDash,
    epilog=render.examples(
        "fi-cache doctor",
        "fi-cache doctor --log vllm.log",
        "fi-cache doctor --flashinfer-version 0.6.17 --finalize unfused --fix --dry-run",
    ),
)
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path, readable=False))
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(path_type=Path, readable=False),
    help="A vLLM/FlashInfer log to explain (repeatable).",
)
@click.option("--flashinfer-version", default=None, help="Target FlashInfer version.")
@click.option("--vllm-version", default=None, help="Target vLLM version.")
@click.option(
    "--sglang-version",
    default=None,
    help="The target is SGLang this version; `-- ARGS` are then `sglang serve` arguments.",
)
@options.finalize(show_default="from VLLM_FLASHINFER_MOE_FUSED_FINALIZE, else fused")
@click.option("--gpu", default=None, help='Target GPU name, e.g. "NVIDIA H100 80GB HBM3".')
@click.option("--strict", is_flag=True, help="Exit 1 on warnings too.")
@click.option("--check", "only", multiple=True, help="Run only this check (repeatable).")
@click.option("--list-checks", is_flag=True, help="List the check ids and exit.")
@click.option(
    "--fix",
    is_flag=True,
    help="Quarantine stale/foreign/corrupt caches, delete old temp files (--dry-run: say which).",
)
@options.dry_run()
def doctor_command(
    paths: tuple[Path, ...],
    logs: tuple[Path, ...],
    flashinfer_version: str | None,
    vllm_version: str | None,
    sglang_version: str | None,
    finalize: str | None,
    gpu: str | None,
    strict: bool,
    only: tuple[str, ...],
    list_checks: bool,
    fix: bool,
    dry_run: bool,
) -> int:
    """Check the store, PATHS and logs against the target environment [-- VLLM_SERVE_ARGS].

    Everything after `--` is a `vllm serve` command line: its arguments, or the whole line as
    you run it (`-- vllm serve MODEL ...`, `-- python -m vllm.entrypoints.openai.api_server
    --model MODEL ...`).
    """
    from fi_cache import doctor
    from fi_cache.doctor import check_ids
    from fi_cache.doctor import fix as fixes
    from fi_cache.doctor.diagnose import Request, diagnose, target_of
    from fi_cache.tier.keys import split_args
    from fi_cache.tier.preload import findings as preload_findings
    from fi_cache.tier.preload import split_preload

    ctx = click.get_current_context()
    obj = ctx.obj
    if list_checks:
        return _list_checks(check_ids.declared(doctor.checks()), obj.json)
    if unknown := check_ids.unknown(only, doctor.checks()):
        known = ", ".join(sorted(c.id for c in check_ids.declared(doctor.checks())))
        raise Refused(f"unknown check id {unknown[0]!r}; known: {known}")
    if dry_run and not fix:
        raise Refused("--dry-run goes with --fix (it prints what --fix would do)")
    engine_argv = ctx.meta.get("vllm_args")
    preload = split_preload(engine_argv) if engine_argv and sglang_version is None else None
    if preload is not None:  # `vllm preload ARGS`: the daemons of the engine those ARGS start
        engine_argv = preload.serve_argv()
    request = Request(
        obj.store,
        tuple(paths),
        tuple(logs),
        tuple(engine_argv) if engine_argv is not None else None,
        flashinfer_version,
        vllm_version,
        sglang_version,
        finalize,
        gpu,
        only,
        fix,
        wrapper=functools.partial(preload_findings, preload) if preload else None,
    )
    if tier_args := split_args(paths)[0]:  # mooncake://KEY: vLLM 0.34's fleet tier
        from fi_cache.cli import tier

        return tier.doctor(tier_args, target_of(request), only, strict, fix, dry_run)
    d = diagnose(request)
    for action, ns in d.held:  # a pinned namespace is known good: --fix leaves it as it is
        render.warn(
            f"left {action.path} as it is: its namespace is pinned; "
            f"`fi-cache unpin {ns}` to let --fix {action.kind} it"
        )
    actions = list(d.actions)
    done = fixes.apply(actions, obj.store) if fix and not dry_run else []
    if obj.json:
        _emit_json(d, actions, done, dry_run)
    else:
        _render(d.findings, d.errors, d.warnings, obj.quiet)
        _render_actions(actions, done, dry_run)
    for path in d.inputs.empty:
        render.error(f"{path}: no FlashInfer autotune caches found here")
    for path in d.inputs.logs_as_paths:
        render.error(
            f"{path}: a text file, not an autotune cache; to explain a log: "
            f"fi-cache doctor --log {render.display_path(path)}"
        )
    if d.refused:
        return EXIT_REFUSED
    return EXIT_PROBLEM if d.errors or (strict and d.warnings) else 0


def _emit_json(
    d: Diagnosis, actions: list[Action], done: list[tuple[Action, Path | None]], dry_run: bool
) -> None:
    target = d.target
    render.emit_json(
        {
            "findings": [f.to_json() for f in d.findings],
            "errors": d.errors,
            "warnings": d.warnings,
            "target": {
                **target.fingerprint.metadata(),
                "arch": target.fingerprint.arch,
                "vllm_version": target.vllm_version,
                "finalize": target.finalize,
                "sglang_version": target.sglang_version,
            },
            "actions": [
                {
                    "action": a.kind,
                    "path": str(a.path),
                    "to": str(to) if to else None,
                    "why": a.why,
                    "applied": not dry_run,
                }
                for a, to in (done or [(a, None) for a in actions])
            ],
        }
    )


def _list_checks(ids: Sequence[CheckId], as_json: bool) -> int:
    if as_json:
        render.emit_json(
            {
                "checks": [
                    {"id": c.id, "summary": c.summary, "severities": list(c.severities)}
                    for c in ids
                ]
            }
        )
    else:
        width = max(len(c.id) for c in ids)
        for c in ids:
            click.echo(f"{c.id:<{width}}  {c.summary}")
    return 0


def _render(findings: Sequence[Finding], errors: int, warnings: int, quiet: bool) -> None:
    colour = sys.stdout.isatty()
    for f in findings:
        if quiet and f.severity == "info":
            continue
        label = f"{f.severity:<7}"
        if colour:
            label = click.style(label, fg=_COLOURS[f.severity], bold=f.severity == "error")
        where = f"{render.display_path(Path(f.path))}: " if f.path else ""
        click.echo(f"{label} {f.check}  {where}{render.printable(f.message, lines=True)}")
        if f.fix and f.fix != "-":
            click.echo(f"        fix: {render.printable(f.fix, lines=True)}")
    infos = len(findings) - errors - warnings
    click.echo(f"{errors} error(s), {warnings} warning(s), {infos} info")


def _render_actions(
    actions: list[Action], done: list[tuple[Action, Path | None]], dry_run: bool
) -> None:
    if dry_run:
        for a in actions:
            click.echo(f"would {a.kind} {a.path}  ({a.why.split(':')[0]})")
    for a, to in done:
        target = f" -> {to}" if to else ""
        click.echo(f"{'quarantined' if a.kind == 'quarantine' else 'removed'} {a.path}{target}")


COMMANDS = [doctor_command]
