"""FlashInfer's token buckets (versions/tuning.py): which buckets a tuning up to N tokens fills,
and which bucket a call of M tokens looks up. Pure."""

from __future__ import annotations

import re

from fi_cache.versions import HYBRID_POWER_OF_2_UNTIL, HYBRID_STEPS


def _next_power_of_2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def tuned_buckets(max_tokens: int) -> tuple[int, ...]:
    """The buckets a tuning whose largest call has `max_tokens` tokens fills
    (`get_hybrid_num_tokens_buckets(max_tokens)`)."""
    out: list[int] = []
    m = 1
    while m <= min(max_tokens, HYBRID_POWER_OF_2_UNTIL):
        out.append(m)
        m *= 2
    start = HYBRID_POWER_OF_2_UNTIL
    for end, step in HYBRID_STEPS:
        m = start + step
        while m <= min(max_tokens, end):
            out.append(m)
            m += step
        start = end
    m = start * 2
    while m <= max_tokens:
        out.append(m)
        m *= 2
    if not out or out[-1] != max_tokens:
        out.append(max_tokens)
    return tuple(sorted(set(out)))


def bucket_of(tokens: int) -> int:
    """The bucket a call of `tokens` tokens looks up (`map_to_hybrid_bucket_uncapped`)."""
    if tokens <= HYBRID_POWER_OF_2_UNTIL:
        return _next_power_of_2(max(tokens, 1))
    for end, step in HYBRID_STEPS:
        if tokens <= end:
            return -(-tokens // step) * step
    return _next_power_of_2(tokens)


_NUMBER = re.compile(r"(-?\d+)")


def shape_order(shapes: str) -> tuple[str | int, ...]:
    """Sort key of a profile's shapes text (`keys.shapes`): numbers as numbers, so bucket 2
    comes before bucket 16 and 128 (a string sort puts 1024x2048 before 128x2048)."""
    parts: list[str | int] = list(_NUMBER.split(shapes))
    parts[1::2] = map(int, parts[1::2])  # the numbers: odd places
    return tuple(parts)
