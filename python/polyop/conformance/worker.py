"""One backend's conformance run in its own process (so frameworks never share one):

    python -m polyop.conformance.worker --backend torch \
        --cases conformance/cases.py:cases --reference conformance/reference.py:reference \
        --out results.jsonl

Writes a JSON header line ({"backend", "version", "modes", "num_cases"}) and then one JSON
line per result, flushed as it goes, so a crash still leaves the results so far.
"""

from __future__ import annotations

import argparse
import json
import sys

from ._load import load_spec
from .backends import load
from .harness import BrokenBackend, Result, run_cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m polyop.conformance.worker")
    ap.add_argument("--backend", required=True)
    ap.add_argument("--cases", required=True, help="FILE.py[:function] returning a list of Case")
    ap.add_argument("--reference", required=True, help="FILE.py[:function](op, inputs, attrs)")
    ap.add_argument("--baseline", default="native", help="backend to match bit for bit ('' = none)")
    ap.add_argument("--ops", default="", help="comma-separated op names to keep (default all)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--library", default="", help="an author's library for this backend")
    ap.add_argument("--baseline-library", default="", help="an author's library for the baseline")
    args = ap.parse_args(argv)

    cases = load_spec(args.cases, "cases")
    cases = list(cases() if callable(cases) else cases)
    if args.ops:
        keep = set(args.ops.split(","))
        cases = [c for c in cases if c.op in keep]
    reference = load_spec(args.reference, "reference")
    backend = load(args.backend, args.library or None)
    baseline = None
    if args.baseline and args.baseline != args.backend:
        baseline = load(args.baseline, args.baseline_library or None)
        if isinstance(baseline, BrokenBackend):
            print(f"baseline unavailable: {baseline.reason}", file=sys.stderr)
            baseline = None

    with open(args.out, "w") as f:
        header = {
            "backend": backend.name,
            "version": getattr(backend, "version", ""),
            "modes": list(backend.modes),
            "num_cases": len(cases),
        }
        f.write(json.dumps(header) + "\n")
        f.flush()

        def progress(r: Result) -> None:
            f.write(json.dumps(r.to_dict()) + "\n")
            f.flush()

        run_cases(cases, reference, [backend], baseline=baseline, progress=progress)
        f.write(json.dumps({"done": True}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
