"""How the lifecycle speaks: a Report of callbacks, which the CLI renders (tests record). The
lifecycle never prints."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fi_cache.doctor.findings import Finding
    from fi_cache.store.locks import Holder


@dataclass
class Report:
    # A note or warning before the engine starts (silent under -q).
    warn: Callable[[str], None] = lambda message: None
    # A pre-flight finding: errors are shown whatever -q says.
    finding: Callable[[Finding], None] = lambda finding: None
    # While warming: waiting for another warm's lock, the engine's last log line, a note.
    waiting: Callable[[Holder | None], None] = lambda holder: None
    tick: Callable[[float, str], None] = lambda elapsed, line: None
    note: Callable[[str], None] = lambda message: None
    quiet: bool = False  # nobody listens to warnings: skip work whose only result is one
