"""Numbers as people read them, in one place: every command and report prints a size, a time, a rate or a
share the same way.

Sizes are binary (KiB = 1024 bytes, MiB, GiB, TiB: what buffers and tensors are counted in), rates decimal
bits per second (Gbit/s, as links are sold), times in µs, ms or s; three or four significant digits.
`None` (a figure a backend does not have) prints as "n/a".
"""
from __future__ import annotations

from collections.abc import Sequence

TIME_UNITS = ((1e6, "s"), (1e3, "ms"), (1.0, "µs"))
RATE_UNITS = ((1e12, "Tbit/s"), (1e9, "Gbit/s"), (1e6, "Mbit/s"), (1e3, "kbit/s"), (1.0, "bit/s"))
SIZE_UNITS = ((float(2**40), "TiB"), (float(2**30), "GiB"), (float(2**20), "MiB"), (float(2**10), "KiB"))
NA = "n/a"


def digits(v: float) -> str:
    """Three or four significant digits, no exponent."""
    a = abs(v)
    return f"{v:.0f}" if a >= 100 else f"{v:.1f}" if a >= 10 else f"{v:.2f}"


def scaled(v: float, units: Sequence[tuple[float, str]]) -> str:
    factor, unit = next(((f, u) for f, u in units if abs(v) >= f), units[-1])
    return f"{digits(v / factor)} {unit}"


def format_us(v: float | None) -> str:
    """A time given in microseconds."""
    return NA if v is None else scaled(v, TIME_UNITS)


def format_bps(v: float | None) -> str:
    """A rate given in bits per second."""
    return NA if v is None else scaled(v, RATE_UNITS)


def format_bytes(v: float | None) -> str:
    """A size given in bytes (binary units)."""
    if v is None:
        return NA
    return f"{v:.0f} B" if abs(v) < 1024 else scaled(v, SIZE_UNITS)


def format_share(v: float | None) -> str:
    """A share (0..1) as a percentage."""
    return NA if v is None else f"{100 * v:.1f} %"


def format_ratio(v: float | None) -> str:
    return NA if v is None else f"{v:.3f}x"
