"""Sizes and FLOP counts in words, as every view writes them."""
from __future__ import annotations


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def human_flops(n: float | None) -> str:
    if n is None:
        return "unknown"
    for unit in ("", "k", "M", "G"):
        if abs(n) < 1000:
            return f"{n:.0f} FLOP" if unit == "" else f"{n:.1f} {unit}FLOP"
        n /= 1000
    return f"{n:.1f} TFLOP"
