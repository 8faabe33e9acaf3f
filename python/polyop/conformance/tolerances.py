"""Tolerances in units of each float dtype's rounding (ulps), for the stock ops.

The per-op numbers and their justification live in one place, ``tolerances.txt`` next to
this module (also read by the Rust kernel tests). A float result is accepted when

    |got - expected| <= ulps * EPS[dtype] * scale + ulps * SMALLEST_NORMAL[dtype]

where ``expected`` is the exact (float64) reference value and ``scale`` is ``|expected|``
unless the reference gives the magnitude of the terms it sums. A zero output therefore fails
for any expected value above a few times the dtype's smallest normal number.
"""

from __future__ import annotations

from pathlib import Path

#: ulp of 1.0 (machine epsilon) per float dtype.
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
#: Smallest positive normal number per float dtype.
SMALLEST_NORMAL = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}
#: ulps for an op missing from the table (an out-of-tree op that sets no tolerance).
DEFAULT_ULPS = 4.0

_TABLE = Path(__file__).with_name("tolerances.txt")


def _load() -> dict[str, tuple[float, str]]:
    table = {}
    for line in _TABLE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, ulps, why = line.split(None, 2)
        table[op] = (float(ulps), why)
    return table


#: op -> (ulps, justification), from tolerances.txt.
STOCK_ULPS: dict[str, tuple[float, str]] = _load()


def op_ulps(op: str) -> float:
    return STOCK_ULPS.get(op, (DEFAULT_ULPS, ""))[0]


def rtol_atol(dtype: str, ulps: float) -> tuple[float, float]:
    """``(rtol, atol)`` for ``ulps`` in ``dtype`` (integers: exact)."""
    if dtype not in EPS:
        return (0.0, 0.0)
    return (ulps * EPS[dtype], ulps * SMALLEST_NORMAL[dtype])


def tolerance(op: str, dtype: str) -> tuple[float, float]:
    """``(rtol, atol)`` of a stock op's result in ``dtype``."""
    return rtol_atol(dtype, op_ulps(op))


def assert_close(actual, expected, op: str, dtype: str | None = None, scale=None, err_msg: str = "") -> None:
    """``actual`` matches the float64 reference ``expected`` within op's ulps in ``dtype``
    (default: actual's dtype); NaN must match NaN, infinities must be equal."""
    import numpy as np

    a = np.asarray(actual)
    dtype = dtype or a.dtype.name
    rtol, atol = tolerance(op, dtype)
    af, ef = a.astype(np.float64), np.asarray(expected, dtype=np.float64)
    s = np.abs(ef) if scale is None else np.asarray(scale, dtype=np.float64)
    np.testing.assert_array_equal(np.isnan(af), np.isnan(ef), err_msg=f"{op} {dtype}: NaN positions {err_msg}")
    inf = np.isinf(ef)
    np.testing.assert_array_equal(af[inf], ef[inf], err_msg=f"{op} {dtype}: infinities {err_msg}")
    fin = np.isfinite(ef)
    err = np.abs(af - ef)
    bound = rtol * s + atol
    bad = fin & ~(err <= bound)
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        raise AssertionError(
            f"{op} {dtype}: {int(bad.sum())} of {a.size} element(s) beyond {op_ulps(op):g} ulps "
            f"(rtol={rtol:.3g}, atol={atol:.3g}); first at {i}: got {af[i]!r}, expected {ef[i]!r} {err_msg}"
        )
