"""env: the detected environment and the namespace dir of each finalize mode."""

from __future__ import annotations

import click

from fi_cache.cli import options, render


@click.command(
    "env",
    epilog=render.examples(
        "fi-cache env",
        "fi-cache --format json env --refresh",
    ),
)
@click.option(
    "--exact/--no-exact",
    default=None,
    help="Ask FlashInfer itself for its metadata (a child process, cached). "
    "Default: when FlashInfer is installed and a GPU is visible.",
)
@click.option("--refresh", is_flag=True, help="Ignore the cached FlashInfer answer.")
def env_command(exact: bool | None, refresh: bool) -> int:
    """Show the detected environment and the namespace dir of each finalize mode."""
    from fi_cache import environment
    from fi_cache.store import locks
    from fi_cache.store.paths import state_dir

    ctx = options.context()
    from fi_cache.engines.vllm.launch import vllm_python

    env = environment.detect(
        state_dir(ctx.store), exact=exact, refresh=refresh, python=vllm_python(None)
    )
    fp = env.fingerprint
    from fi_cache.store.namespace import FINALIZE_MODES, Namespace

    namespaces = {mode: str(Namespace(fp, mode).path(ctx.store)) for mode in FINALIZE_MODES}
    lock = (
        locks.lock_strategy(ctx.store) if ctx.store.is_dir() else ("flock", "store not created yet")
    )
    doc = {
        "metadata": fp.metadata(),
        "sources": env.sources,
        "arch": fp.arch,
        "gpus": [
            {"index": g.index, "name": g.name, "compute_cap": g.compute_cap} for g in env.gpus
        ],
        "torch_version": env.torch_version,
        "python": env.python,  # whose packages these are: the interpreter that runs vLLM
        "vllm": {
            "version": env.vllm.version,
            "envs_path": env.vllm.envs_path,
            "supports_fused_finalize_env": env.vllm.supports_finalize_env,
        },
        "store": str(ctx.store),
        "lock": {"strategy": lock[0], "why": lock[1]},
        "namespaces": namespaces,
        "notes": list(env.notes),
        "flashinfer_probe_failed": env.probe_failed,  # null when FlashInfer answered
    }
    if ctx.json:
        render.emit_json(doc)
        return 0
    rows = [
        [name, value or "-", env.sources.get(name, "not detected")]
        for name, value in fp.metadata().items()
    ]
    rows.append(["arch (vLLM dir)", fp.arch or "-", env.sources.get("arch", "not detected")])
    click.echo(render.table(["FIELD", "VALUE", "SOURCE"], rows))
    gpus = ", ".join(f"{g.index}: {g.name} ({g.compute_cap})" for g in env.gpus) or "none visible"
    vllm = env.vllm
    support = {True: "supports", False: "does NOT support", None: "cannot tell whether it supports"}
    click.echo(f"\nGPUs    {gpus}")
    click.echo(f"torch   {env.torch_version or 'not installed'}")
    click.echo(f"python  {env.python}  (its packages name the namespace)")
    if vllm.version:
        click.echo(
            f"vLLM    {vllm.version}: {support[vllm.supports_finalize_env]} "
            "VLLM_FLASHINFER_MOE_FUSED_FINALIZE (the deterministic MoE path)"
        )
    else:
        click.echo("vLLM    not installed")
    click.echo(f"store   {ctx.store}  (locks: {lock[0]}; {lock[1]})")
    for mode, path in namespaces.items():
        click.echo(f"  {mode:<8}{path}")
    for note in env.notes:
        render.warn(note)
    if env.probe_failed and not any(env.probe_failed in n for n in env.notes):
        render.warn(
            f"{env.probe_failed} (remembered for an hour; --refresh asks FlashInfer again); "
            "using the cheap probe's values"
        )
    return 0


COMMANDS = [env_command]
