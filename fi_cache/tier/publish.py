"""push/pull between a store namespace and the tier, under vLLM's exact keys.

The tier's key carries no FlashInfer version, GPU, CUDA stack or finalize mode, so fi-cache
answers for it: push publishes only verified tables whose `_metadata` is fully detected, from
one namespace (one finalize mode), and never over another table unless asked; pull adopts only
tables that fit this machine and the namespace's finalize mode (doctor's checks, tier/judge.py).
Plans are made in full before anything is written: a refusal writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from fi_cache.caches.inventory import Cache, scan
from fi_cache.doctor.inputs import Target
from fi_cache.errors import Refused
from fi_cache.tier.judge import judge
from fi_cache.tier.keys import TierArg, TierKey
from fi_cache.tier.mooncake import TierClient
from fi_cache.tier.read import TierInventory
from fi_cache.versions import INDETERMINATE_VALUES, METADATA_KEY, VLLM_RANK_FILE

if TYPE_CHECKING:
    from fi_cache.store.namespace import Namespace

VLLM_SUBDIR = "vllm"  # VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR inside a namespace (engines/vllm)


@dataclass(frozen=True)
class PushItem:
    key: TierKey
    source: Path
    data: bytes
    action: Literal["publish", "same", "replace"]
    # MoE keys of FlashInfer <= 0.6.17 record no finalize mode, nor does the tier's key
    mode_blind: bool = False


def _rank_files(ns_dir: Path, arg: TierArg) -> list[tuple[TierKey, Path]]:
    hash_dir = ns_dir / VLLM_SUBDIR / arg.config_hash
    if arg.one is not None:
        path = hash_dir / arg.one.filename
        return [(arg.one, path)] if path.is_file() else []
    out = []
    for path in sorted(hash_dir.glob("autotune_configs_dp*_rank*.json")):
        if m := VLLM_RANK_FILE.match(path.name):
            out.append((TierKey(arg.config_hash, int(m.group(1)), int(m.group(2))), path))
    return out


def push_sources(ns_dirs: list[Path], arg: TierArg) -> list[tuple[TierKey, Path]]:
    """The namespace's rank files for the key(s). Refused unless exactly one namespace has them:
    the tier's key would hide which environment and finalize mode a table is of."""
    found = {d: files for d in ns_dirs if (files := _rank_files(d, arg))}
    if not found:
        raise Refused(
            f"no rank table for this config hash in {len(ns_dirs)} namespace(s) "
            f"(looked in <namespace>/{VLLM_SUBDIR}/{arg.config_hash}/)",
            arg.text,
        )
    if len(found) > 1:
        names = ", ".join(d.name for d in found)
        raise Refused(
            f"several namespaces hold this config ({names}); the tier's key records no "
            "environment or finalize mode: name one with --namespace",
            arg.text,
        )
    return next(iter(found.values()))


def _read_checked(path: Path, store: Path) -> Cache:
    """The file, if it may reach the tier: only what `verify` passes, with every `_metadata`
    field detected (an "unknown" one blocks every fully detected host), of its namespace's own
    FlashInfer and GPU (the tier's key would not say it is another's). Refused otherwise."""
    inv = scan([path])
    if inv.problems:
        raise Refused(f"not published: {inv.problems[0].message}", path)
    cache = inv.caches[0]
    if (why := _unpublishable(cache) or _not_of_namespace(cache, store)) is not None:
        raise Refused(f"not published: {why}", path)
    return cache


def _not_of_namespace(cache: Cache, store: Path) -> str | None:
    from fi_cache.store.namespace import namespace_parts, slug

    parts = namespace_parts(cache.path, store)
    meta = cache.metadata or {}
    for name in ("flashinfer_version", "gpu"):
        value = meta.get(name)
        if parts and slug(value if isinstance(value, str) else None) != parts[name]:
            return f"its {name} {value!r} is not its namespace's ({parts[name]}): a stray file"
    return None


def _unpublishable(cache: Cache) -> str | None:
    if defects := cache.defects():
        return f"verify finds it corrupt ({defects[0].message})"
    meta = cache.metadata
    if meta is None:
        return f"it has no {METADATA_KEY}: every daemon would adopt it on any GPU"
    vague = [k for k, v in meta.items() if v is None or v in INDETERMINATE_VALUES]
    if vague:
        return (
            f"its {METADATA_KEY} is indeterminate ({', '.join(vague)}): every fully detected "
            "host would reject it, and the key would stay taken"
        )
    return None


def plan_push(
    client: TierClient, sources: list[tuple[TierKey, Path]], replace: bool, store: Path
) -> list[PushItem]:
    items = []
    for key, path in sources:
        blind = _read_checked(path, store).finalize() == "unknown"
        data = path.read_bytes()
        size = client.size(key.key)
        if size is None:
            items.append(PushItem(key, path, data, "publish", blind))
            continue
        if size == len(data) and client.get(key.key) == data:
            items.append(PushItem(key, path, data, "same", blind))
            continue
        if not replace:
            raise Refused(
                "the key already holds another table (first writer wins: vLLM would keep "
                "it); `fi-cache doctor` it, or push --replace",
                key.url,
            )
        items.append(PushItem(key, path, data, "replace", blind))
    return items


def apply_push(client: TierClient, items: list[PushItem]) -> list[PushItem]:
    """Publish the plan; returns the items whose key now holds our table."""
    done = []
    for item in items:
        if item.action == "same":
            continue
        if item.action == "replace":
            client.remove(item.key.key)
        if client.publish(item.key.key, item.data).written:
            done.append(item)
    return done


@dataclass(frozen=True)
class PullItem:
    key: TierKey
    dest: Path
    data: bytes
    action: Literal["install", "same"]


def plan_pull(inv: TierInventory, target: Target, ns_dir: Path) -> list[PullItem]:
    """Every table checked against the target first; one that does not fit refuses the pull."""
    if inv.problems:
        p = inv.problems[0]
        raise Refused(f"not pulled: {p.message}", f"mooncake://{p.path}")
    errors = [f for f in judge(inv, target) if f.severity == "error"]
    if errors:
        f = errors[0]
        raise Refused(f"not pulled: {f.message.split('. ')[0]}", f.path)
    items = []
    for cache in inv.caches:
        key = _key_of(cache.path)
        dest = ns_dir / VLLM_SUBDIR / key.config_hash / key.filename
        data = inv.raw[str(cache.path)]
        if dest.exists():
            if dest.read_bytes() != data:
                raise Refused(
                    "the namespace already holds another table for this rank: "
                    "`fi-cache evict` or move it first",
                    dest,
                )
            items.append(PullItem(key, dest, data, "same"))
        else:
            items.append(PullItem(key, dest, data, "install"))
    return items


def _key_of(path: Path) -> TierKey:
    m = VLLM_RANK_FILE.match(path.name)
    assert m is not None  # read() made it from a TierKey
    return TierKey(path.parent.name, int(m.group(1)), int(m.group(2)))


def apply_pull(items: list[PullItem], ns: Namespace, store: Path) -> list[PullItem]:
    """Install the plan into the namespace under its lock (store writes: temp file, fsync,
    link); a file that appeared meanwhile is left as it is and refuses the rest."""
    from fi_cache.store import locks
    from fi_cache.store import manifest as manifests
    from fi_cache.store.files import create_new, ensure_dir

    ns_dir = ns.path(store)
    done = []
    with locks.namespace_lock(ns_dir, "pull mooncake://"):
        if manifests.load(ns_dir) is None:
            manifests.save(ns_dir, manifests.Manifest.new(ns))
        for item in items:
            if item.action != "install":
                continue
            ensure_dir(item.dest.parent)
            if create_new(item.dest, item.data) is None:
                raise Refused("a table appeared here meanwhile: left as it is", item.dest)
            done.append(item)
    return done
