"""A finding: one thing wrong (or worth knowing) about a cache, with its reason and its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    check: str  # a stable check id, e.g. "stale-gemm2-profile"
    severity: Severity
    path: str | None
    message: str
    fix: str

    def to_json(self) -> dict[str, str | None]:
        return {
            "check": self.check,
            "severity": self.severity,
            "path": self.path,
            "message": self.message,
            "fix": self.fix,
        }
