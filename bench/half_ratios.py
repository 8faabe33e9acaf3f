"""float16 / bfloat16 elements per second against float32's, per op, from saved results:

    .venv/bin/python bench/run.py --quick --ops add,gelu,softmax --save /tmp/b.json
    .venv/bin/python bench/half_ratios.py /tmp/b.json [more.json ...]

A ratio of 1.00 means the half type moves as many elements per second as float32 (so twice the
bytes' rate); "built-in" is the framework's own op's same ratio.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Result, half_ratios  # noqa: E402


def main(paths: list[str]) -> int:
    results = []
    for p in paths:
        results += [Result(**r) for r in json.loads(Path(p).read_text())["results"]]
    rows = half_ratios(results)
    print("| framework | op | input | dtype | polyop elem/s vs f32 | built-in elem/s vs f32 |")
    print("|---|---|---|---|---|---|")
    for fw, op, label, dt, p, b in rows:
        print(f"| {fw} | {op} | {label} | {dt} | {p:.2f} | {b:.2f} |")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
