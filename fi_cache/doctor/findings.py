"""A finding: one thing wrong (or worth knowing) about a cache, with its reason and its fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Severity = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    check: str  # a stable check id, e.g. "stale-gemm2-profile"
    severity: Severity
    path: str | None
    message: str
    fix: str  # "-" or "": nothing to do (JSON null)
    details: dict[str, Any] | None = None  # machine-readable facts behind the message

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "check": self.check,
            "severity": self.severity,
            "path": self.path,
            "message": self.message,
            "fix": None if self.fix in ("", "-") else self.fix,
        }
        if self.details is not None:
            out["details"] = self.details
        return out
