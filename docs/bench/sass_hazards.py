"""Writes to registers of running register-sourced wgmma products in compiled kernels (:mod:`quantkit.bench.sass`):
every cubin of the Gluon wgmma kernels in the Triton cache (what the GPU tests or a bench compiled), or given cubins.
``python -m quantkit.bench.sass`` instead compiles the launches the rules use for sm_90 without a GPU.

    python docs/bench/sass_hazards.py                      # the Triton cache ($TRITON_CACHE_DIR or ~/.triton/cache)
    python docs/bench/sass_hazards.py path/to/kernel.cubin  # given cubins
"""

from __future__ import annotations

import glob
import os
import sys

from quantkit.bench.sass import hazards_in, instructions, register_products

KERNELS = ("_lqq_wgmma_kernel", "_lqq_ws_kernel", "_lqq_ws_kpair_kernel", "_w4a16_wgmma_kernel", "_w4a16_ws_kernel",
           "_w8a8_wgmma_kernel")


def main() -> int:
    paths = sys.argv[1:]
    if not paths:
        cache = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
        paths = sorted(p for name in KERNELS for p in glob.glob(os.path.join(cache, "*", name + ".cubin")))
    bad = 0
    for path in paths:
        code = instructions(path)
        found = hazards_in(code)
        bad += bool(found)
        print(f"{path}: {register_products(code)} register-operand products, {len(found)} hazard(s)")
        for line in found[:5]:
            print("   ", line)
    print(f"{len(paths)} cubin(s), {bad} with hazards")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
