"""plan: write a tuning plan for `warm --engine flashinfer` from a model's config.json, or check
one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from fi_cache.cli import options, render
from fi_cache.errors import Refused

_TOKENS_HELP = (
    "Token counts each op is run at, comma-separated (FlashInfer tunes every bucket up to each)."
)


def _tokens(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected numbers like 1,16,128,1024") from None
    if not values:
        raise click.BadParameter("expected at least one token count")
    return values


@click.command(
    "plan",
    epilog=render.examples(
        "fi-cache plan --from-hf-config ~/models/Qwen3-30B-A3B -o plan.toml",
        "fi-cache plan --verify plan.toml",
        "fi-cache plan --from-hf-config config.json --finalize unfused --tp-size 2 -o plan.toml",
    ),
)
@click.option(
    "--from-hf-config",
    "hf_config",
    type=click.Path(path_type=Path),
    default=None,
    help="A Hugging Face config.json (or model dir): write the cutlass_fused_moe part from it.",
)
@click.option(
    "--verify",
    "--check",
    "check_path",
    metavar="PLAN",
    type=click.Path(path_type=Path),
    default=None,
    help="Read a plan and list what `warm --engine flashinfer` would run (exit 2 if invalid); "
    "--check is its old name.",
)
@click.option("--tokens", default="1,16,128,1024", show_default=True, help=_TOKENS_HELP)
@click.option(
    "--finalize",
    type=click.Choice(["fused", "unfused", "both"]),
    default="both",
    show_default=True,
    help="MoE finalize modes to tune (each fills its own namespace).",
)
@click.option(
    "--dtype",
    type=click.Choice(["bf16", "fp16"]),
    default=None,
    help="MoE dtype when the config names none or another [default: the config's]. "
    "Quantised models are refused, --dtype or not: fi-cache tunes unquantised MoE only.",
)
@click.option("--tp-size", type=click.IntRange(1), default=1, show_default=True)
@click.option("--ep-size", type=click.IntRange(1), default=1, show_default=True)
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the plan here (default: stdout).",
)
def plan_command(
    hf_config: Path | None,
    check_path: Path | None,
    tokens: str,
    finalize: str,
    dtype: str | None,
    tp_size: int,
    ep_size: int,
    output: Path | None,
) -> int:
    """Write a tuning plan from a model's config.json, or check one.

    --verify PLAN (old name: --check) reads a plan and lists what it runs; the options that shape
    a new plan are refused with it."""
    from fi_cache.engines.flashinfer import hf_config as hf
    from fi_cache.engines.flashinfer import plan as plans

    ctx = options.context()
    if (hf_config is None) == (check_path is None):
        raise Refused("give one of --from-hf-config CONFIG or --verify PLAN")
    if check_path is not None:  # the options that shape a new plan would be ignored
        options.refuse_ignored(
            "to --verify PLAN (they shape a plan --from-hf-config writes)",
            "tokens",
            "finalize",
            "dtype",
            "tp_size",
            "ep_size",
            "output",
        )
        from fi_cache.engines import get

        _show_plan(get("flashinfer").read_args([str(check_path)]).plan, ctx.json)
        return 0
    assert hf_config is not None
    config = hf.load_config(hf_config)
    modes = ("fused", "unfused") if finalize == "both" else (finalize,)
    plan = hf.plan_from_config(
        config,
        str(hf_config),
        tokens=_tokens(tokens),
        dtype=dtype,
        finalize=modes,
        tp_size=tp_size,
        ep_size=ep_size,
    )
    text = plans.dumps(
        plan,
        [
            f"fi-cache tuning plan for {hf.describe(config)}, from {hf_config}",
            "Run it: fi-cache warm --engine flashinfer --plan THIS_FILE",
            "tokens: the token counts each op runs at; FlashInfer tunes every bucket up to them.",
        ],
    )
    if tp_size * ep_size > 1:
        from fi_cache.versions import MOE_KEY_HAS_RANKS

        render.warn(
            f"{len(plan.ops)} ops, one per rank: FlashInfer {MOE_KEY_HAS_RANKS.describe()} puts "
            "tp_rank and ep_rank in MoE keys"
        )
    if output is not None:
        from fi_cache.store import files

        files.refuse_destination(output, "plan file", parent_must_exist=True)
        files.atomic_write(files.through_links(output), text.encode(), lock=False)
        render.warn(f"wrote {output} ({len(plan.ops)} op{'s' if len(plan.ops) > 1 else ''})")
    if ctx.json:  # one document: the plan's TOML is a field of it, not the output
        render.emit_json({"output": str(output) if output else None, "toml": text, **_doc(plan)})
    elif output is None:
        click.echo(text, nl=False)
    return 0


def _doc(plan: Any) -> dict[str, Any]:
    """What a plan runs: its modes, the calls each namespace gets, its ops."""
    from fi_cache.engines.flashinfer.plan import op_to_json

    return {
        "modes": list(plan.modes),
        "calls": {m: sum(o.n_calls for o in plan.for_mode(m)) for m in plan.modes},
        "ops": [op_to_json(o) for o in plan.ops],
    }


def _show_plan(plan: Any, as_json: bool) -> None:
    doc = _doc(plan)
    calls = doc["calls"]
    if as_json:
        render.emit_json({"plan": plan.source, **doc})
        return
    for op in plan.ops:
        extra = f" finalize={','.join(op.finalize)}" if hasattr(op, "finalize") else ""
        backends = f" [{', '.join(op.backends)}]" if hasattr(op, "backends") else ""
        tokens = ",".join(str(t) for t in op.tokens)
        click.echo(f"op {op.index}: {op.label}{backends}{extra} tokens={tokens}")
    for mode, n in calls.items():
        click.echo(f"{mode} namespace: {n} calls")


COMMANDS = [plan_command]
