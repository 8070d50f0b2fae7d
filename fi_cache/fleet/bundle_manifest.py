"""A bundle's manifest (`fi-cache-bundle.json`, its first member): the namespaces it carries with
their fingerprints, and every file's size and sha256. Parsing refuses anything else in one line."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fi_cache.errors import Refused
from fi_cache.model import jsoncheck
from fi_cache.model.fingerprint import FINGERPRINT_FIELDS, Fingerprint

FORMAT = "fi-cache-bundle"
SCHEMA = 1
# A namespace holds a few v1 files, or one v2 store with a file per tuned key shared by every
# model served in that environment: thousands at most. A manifest lists each file in ~260 bytes.
MAX_FILES = 50_000


@dataclass(frozen=True)
class BundledNamespace:
    path: str  # posix, relative to the store: namespaces/<fi>/<arch>/<gpu>/<mode>-<hash>
    fingerprint: Fingerprint
    finalize: str


@dataclass(frozen=True)
class BundleFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class BundleManifest:
    namespaces: tuple[BundledNamespace, ...]
    files: tuple[BundleFile, ...]
    created: float
    fi_cache_version: str

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "schema": SCHEMA,
            "fi_cache_version": self.fi_cache_version,
            "created": self.created,
            "namespaces": [
                {"path": n.path, "fingerprint": asdict(n.fingerprint), "finalize": n.finalize}
                for n in self.namespaces
            ],
            "files": [asdict(f) for f in self.files],
        }


def parse_manifest(data: Any) -> BundleManifest:
    """Raises Refused with the reason for anything that is not a bundle manifest."""
    if (why := jsoncheck.problem(data)) is not None:
        raise Refused(f"malformed bundle manifest ({why})")
    try:
        if data["format"] != FORMAT or int(data["schema"]) != SCHEMA:
            raise Refused(f"not a schema-{SCHEMA} fi-cache bundle")
        if not isinstance(data["files"], list) or not isinstance(data["namespaces"], list):
            raise TypeError("files and namespaces must be lists")
        count = max(len(data["files"]), len(data["namespaces"]))
        if count > MAX_FILES:  # before building an object per entry
            raise Refused(f"bundle manifest lists {count} entries, over the limit of {MAX_FILES}")
        namespaces = tuple(
            BundledNamespace(
                str(n["path"]),
                _fingerprint(n["fingerprint"]),
                str(n["finalize"]),
            )
            for n in data["namespaces"]
        )
        files = tuple(
            BundleFile(str(f["path"]), _size(f["size"]), str(f["sha256"])) for f in data["files"]
        )
        return BundleManifest(
            namespaces, files, float(data["created"]), str(data["fi_cache_version"])
        )
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
        raise Refused(f"malformed bundle manifest ({exc})") from None


def _size(value: Any) -> int:
    size = int(value)
    if size < 0:
        raise ValueError(f"negative size {size}")
    return size


def _fingerprint(data: Any) -> Fingerprint:
    values = {k: v for k, v in dict(data).items() if k in FINGERPRINT_FIELDS}
    if not all(v is None or isinstance(v, str) for v in values.values()):
        raise ValueError("fingerprint values must be strings")
    return Fingerprint(**values)
