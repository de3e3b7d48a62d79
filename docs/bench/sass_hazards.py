"""Static check of compiled wgmma kernels: does any instruction write a register that is the A operand of a
register-sourced IGMMA/HGMMA still in flight (issued, not yet retired by a ``WARPGROUP.DEPBAR``)? ptxas does not
keep such registers alive for the asynchronous product (session 16: the LiquidQuant Gluon kernel's 96-token
launches returned wrong sums while their SASS showed such writes), so a kernel that passes its tests may still
race. The walk follows the code in order and takes each backward branch once (two loop iterations), retiring
products at each DEPBAR; a write's width is taken from its opcode (.128: 4 registers, .64/.WIDE: 2).

    python docs/bench/sass_hazards.py                      # every cubin of the Gluon wgmma kernels in the Triton cache
    python docs/bench/sass_hazards.py path/to/kernel.cubin  # given cubins
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

KERNELS = ("_lqq_wgmma_kernel", "_lqq_ws_kernel", "_w4a16_wgmma_kernel", "_w8a8_wgmma_kernel")
NOT_A_WRITE = ("ST", "RED", "ATOM", "BAR", "SYNCS", "BRA", "WARPSYNC", "LDGSTS", "UTMA", "EXIT", "RET")


def cuobjdump() -> str:
    """cuobjdump from PATH, else the one Triton ships."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def instructions(cubin: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction in ``cubin``."""
    out = subprocess.run([cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2).strip()) for m in
            (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in out.splitlines()) if m]


def _width(op: str) -> int:
    return 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1


def hazards(cubin: str) -> list[str]:
    """Writes to registers that an in-flight register-sourced wgmma reads (empty: none found)."""
    code = instructions(cubin)
    index = {a: i for i, (a, _) in enumerate(code)}
    pending: list[tuple[int, set[int]]] = []
    taken: set[int] = set()
    found: list[str] = []
    i = steps = 0
    while i < len(code) and steps < 100000:
        steps += 1
        addr, text = code[i]
        body = re.sub(r"^@!?U?P\w+\s+", "", text)
        op = body.split()[0]
        if "GMMA" in op:
            operands = [o.strip() for o in body[len(op):].split(",")]
            if len(operands) > 1 and re.fullmatch(r"R\d+", operands[1]):  # D, A (registers), B descriptor, C
                a = int(operands[1][1:])
                pending.append((addr, set(range(a, a + 4))))
        elif op.startswith("WARPGROUP.DEPBAR"):
            keep = int(body.split(",")[-1].strip(), 16)
            pending = pending[len(pending) - keep:] if keep else []
        else:
            m = re.match(r"[\w.]+\s+R(\d+)\b", body)
            if m and not op.startswith(NOT_A_WRITE):
                written = set(range(int(m.group(1)), int(m.group(1)) + _width(op)))
                found += [f"{addr:#06x} {text}  (A operand of the product at {mma:#06x})"
                          for mma, regs in pending if written & regs]
        if op.endswith("BRA"):
            target = re.search(r"0x([0-9a-f]+)", body)
            if target and int(target.group(1), 16) < addr and addr not in taken and int(target.group(1), 16) in index:
                taken.add(addr)
                i = index[int(target.group(1), 16)]
                continue
        if op == "EXIT" and not text.startswith("@"):
            break
        i += 1
    return found


def main() -> int:
    paths = sys.argv[1:]
    if not paths:
        cache = os.environ.get("TRITON_CACHE_DIR", os.path.expanduser("~/.triton/cache"))
        paths = sorted(p for name in KERNELS for p in glob.glob(os.path.join(cache, "*", name + ".cubin")))
    bad = 0
    for path in paths:
        found = hazards(path)
        bad += bool(found)
        print(f"{path}: {len(found)} hazard(s)")
        for line in found[:5]:
            print("   ", line)
    print(f"{len(paths)} cubin(s), {bad} with hazards")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
