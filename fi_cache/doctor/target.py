"""The environment the doctor judges against: the detected one, each field the user names
overriding one detected value (a GPU named as `ls` prints it resolved to its full name)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fi_cache.doctor.inputs import Target
from fi_cache.engines.sglang import layout as sglang_layout
from fi_cache.engines.sglang.args import env_bool, parse_sglang_args
from fi_cache.environment import Environment
from fi_cache.errors import Refused
from fi_cache.model.fingerprint import GPU_VENDOR, Fingerprint, short_gpu_name
from fi_cache.versions import (
    SGLANG_FINALIZE_ENV,
    VLLM_FINALIZE_ENV,
    VLLM_NEWEST_CHECKED,
    parse_version,
    sglang_finalize_default,
)


@dataclass(frozen=True)
class Overrides:
    flashinfer_version: str | None = None
    vllm_version: str | None = None
    finalize: str | None = None
    gpu: str | None = None
    sglang_version: str | None = None
    sglang_argv: tuple[str, ...] | None = None


def resolve_gpu(name: str, known: Iterable[str]) -> str:
    """The full GPU name `name` stands for: itself when it is one, else the one known name (of
    the caches examined, of this machine's GPUs) it is the short or vendor-less form of, else
    "NVIDIA " + a one-word name. Raises Refused when it names several."""
    names = {n for n in known if n}
    if name in names or name.startswith(GPU_VENDOR):
        return name
    low = name.lower()
    matches = sorted(
        n for n in names if low in (short_gpu_name(n).lower(), n.removeprefix(GPU_VENDOR).lower())
    )
    if len(matches) > 1:
        raise Refused(
            f"--gpu {name!r} names several GPUs: {', '.join(matches)}; give the full name"
        )
    if matches:
        return matches[0]
    return name if " " in name else GPU_VENDOR + name  # a short name is one word, as `ls` prints it


def _valid_version(flag: str, text: str | None) -> None:
    if text is not None and parse_version(text) is None:
        raise Refused(f"{flag} {text!r} is not a version (e.g. 0.6.17, 0.7.2.post1)")


def make_target(env: Environment, o: Overrides, environ: dict[str, str]) -> Target:
    """The detected environment, each given field overriding one detected value."""
    _valid_version("--flashinfer-version", o.flashinfer_version)
    _valid_version("--vllm-version", o.vllm_version)
    fp = env.fingerprint
    if o.flashinfer_version:
        fp = fp.replace(flashinfer_version=o.flashinfer_version)
    if o.gpu:
        fp = fp.replace(gpu=o.gpu)
    if o.vllm_version and parse_version(o.vllm_version) != parse_version(env.vllm.version):
        version = parse_version(o.vllm_version)
        # A named release: we know no release up to the newest checked has the variable.
        supports = False if version is not None and version <= VLLM_NEWEST_CHECKED else None
        vllm_version: str | None = o.vllm_version
    else:
        vllm_version, supports = env.vllm.version, env.vllm.supports_finalize_env
    if o.sglang_version is not None:
        return _sglang_target(fp, o, environ)
    finalize = o.finalize or ("unfused" if environ.get(VLLM_FINALIZE_ENV) == "0" else "fused")
    return Target(fp, vllm_version, supports, finalize)


def _sglang_target(fp: Fingerprint, o: Overrides, environ: dict[str, str]) -> Target:
    """SGLang's mode: --finalize, else its flag (deterministic forces unfused), else its
    variable, else its release's default (versions.sglang_finalize_default)."""
    _valid_version("--sglang-version", o.sglang_version)
    args = parse_sglang_args(o.sglang_argv or ())
    said = env_bool(sglang_layout.effective(environ, SGLANG_FINALIZE_ENV))
    if o.finalize:
        finalize = o.finalize
    elif args.deterministic:
        finalize = "unfused"
    elif said is not None and sglang_finalize_default(o.sglang_version) is not None:
        finalize = "fused" if said else "unfused"
    else:
        finalize = sglang_finalize_default(o.sglang_version) or "fused"
    return Target(fp, None, None, finalize, o.sglang_version)
