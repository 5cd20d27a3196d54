"""Numbers as people read them, in one place: every command and report prints a size, a time, a rate or a
share the same way.

Sizes are binary (KiB = 1024 bytes, MiB, GiB, TiB: what buffers and tensors are counted in), rates decimal
bits per second (Gbit/s, as links are sold); three or four significant digits. Times are in s, ms, µs, or ns
below 1 µs, to four significant figures (`format_us`), so that a bandwidth recomputed from a printed time agrees
with the bandwidth printed beside it. `None` (a figure a backend does not have) prints as "n/a".
"""
from __future__ import annotations

import math
from collections.abc import Sequence

TIME_UNITS = ((1e6, "s"), (1e3, "ms"), (1.0, "µs"), (1e-3, "ns"))
#: Significant figures of a printed time: a bandwidth recomputed from it (bytes x 8 x factor / time) is then
#: within 0.05% of the true one, inside the rounding of the three figures a rate prints with (`digits`).
TIME_DIGITS = 4
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


def significant(v: float, n: int) -> str:
    """`v` to `n` significant figures, no exponent; trailing zeros kept, as they are figures too (1.5 to 4
    figures is "1.500", 110 is "110.0"; 12345 is "12345")."""
    if v == 0 or not math.isfinite(v):
        return f"{v:.0f}"
    return f"{v:.{max(0, n - 1 - math.floor(math.log10(abs(v))))}f}"


def format_us(v: float | None) -> str:
    """A time given in microseconds, to `TIME_DIGITS` significant figures: in s, ms, µs, or ns below 1 µs
    (a 4-byte all-reduce of 1.2 ns prints "1.200 ns", not "0.00 µs"); 0 prints "0 µs"."""
    if v is None:
        return NA
    if v == 0 or not math.isfinite(v):
        return f"{abs(v) if v == 0 else v:.0f} µs"
    rounded = float(f"{v:.{TIME_DIGITS - 1}e}")  # first, so that 999.96 µs is "1 ms", not "1000 µs"
    factor, unit = next(((f, u) for f, u in TIME_UNITS if abs(rounded) >= f), TIME_UNITS[-1])
    return f"{significant(rounded / factor, TIME_DIGITS)} {unit}"


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
