"""``python -m quantkit.bench``: time the kernels on the current GPU and print / save the table.

Example (the command docs/BENCHMARKS.md quotes)::

    python -m quantkit.bench --shapes 14336x4096,4096x4096 --ms 1,16,64,256,1024,4096 \\
        --methods w4a16,w8a8,w4a8,w4a8-lqq,mixed,w4a8+aq --json bench.json
"""

from __future__ import annotations

import argparse
import json

from quantkit.bench.command import parse_shapes
from quantkit.bench.problems import METHODS
from quantkit.bench.report import format_table
from quantkit.bench.runner import run_bench
from quantkit.errors import QuantkitError


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run :func:`quantkit.bench.runner.run_bench`, print the table, optionally save JSON."""
    p = argparse.ArgumentParser(prog="python -m quantkit.bench", description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="14336x4096,4096x4096", help="NxK (out x in features), comma-separated")
    p.add_argument("--ms", default="1,16,64,256,1024,4096", help="token counts M, comma-separated")
    p.add_argument("--methods", default="w4a16,w8a8,w4a8,w4a8-lqq,mixed",
                   help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--json", help="write the rows (and ceilings) to this file")
    args = p.parse_args(argv)
    try:
        methods = [x for x in args.methods.split(",") if x]
        unknown = [x for x in methods if x not in METHODS]
        if unknown:
            raise QuantkitError(f"unknown --methods {unknown}; known: {', '.join(METHODS)}")
        rows = run_bench(parse_shapes(args.shapes), [int(v) for v in args.ms.split(",")], methods, reps=args.reps)
    except QuantkitError as e:
        print(f"error: {e}")
        return 2
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
