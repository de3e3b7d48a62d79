"""The SASS of the Gluon wgmma kernels, without a GPU: compile a launch for sm_90 with the installed Triton (its
bundled ptxas) and look for writes to registers that a running register-sourced wgmma still reads.

Why: ptxas does not keep a register A operand alive while its asynchronous product runs. Session 16 found the
LiquidQuant and W4A16 Gluon kernels writing such registers (their next tile's planes and addresses) before the
``WARPGROUP.DEPBAR`` that retired the product, and the LiquidQuant 96-token launches returning wrong sums on an
H100 (docs/BENCHMARKS.md). Tests pass most of the time on such a kernel; this check does not depend on timing.

:func:`hazards` walks a cubin's SASS in order, taking each backward branch once (two loop iterations): an
IGMMA/HGMMA whose A operand is registers adds those four registers to the in-flight set, ``WARPGROUP.DEPBAR.LE
gsb0, n`` retires all but the newest n, and any instruction whose destination overlaps an in-flight set is
reported (a write's width from its opcode: .128 → 4 registers, .64/.WIDE → 2). :func:`check_gluon_kernels`
compiles the launches the launch rules use and checks each; ``python -m quantkit.bench.sass`` prints the result.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

NOT_A_WRITE = ("ST", "RED", "ATOM", "BAR", "SYNCS", "BRA", "WARPSYNC", "LDGSTS", "UTMA", "EXIT", "RET")


def cuobjdump() -> str | None:
    """cuobjdump from PATH, else the one Triton ships, else None."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:  # pragma: no cover - Triton is a dependency of the kernels
        return None
    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    return bundled if os.path.exists(bundled) else None


def instructions(cubin: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction in the cubin file ``cubin``."""
    out = subprocess.run([cuobjdump(), "-sass", cubin], capture_output=True, text=True, check=True).stdout
    return [(int(m.group(1), 16), m.group(2).strip()) for m in
            (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in out.splitlines()) if m]


def _width(op: str) -> int:
    return 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op) else 1


def hazards(cubin: str) -> list[str]:
    """Writes to registers that an in-flight register-sourced wgmma reads in the cubin file ``cubin``, one line each
    (empty: none found); :func:`hazards_in` on its :func:`instructions`."""
    return hazards_in(instructions(cubin))


def hazards_in(code: list[tuple[int, str]]) -> list[str]:
    """:func:`hazards` of a SASS listing, (address, instruction text) in address order (module docstring)."""
    index = {a: i for i, (a, _) in enumerate(code)}
    pending: list[tuple[int, set[int]]] = []
    taken: set[int] = set()
    found: list[str] = []
    i = steps = 0
    while i < len(code) and steps < 200000:
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


class _Sm90:
    """A stand-in for Triton's CUDA driver that reports an sm_90 target, so a launch compiles without a GPU."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget

        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


def compile_sm90(kernel, *args, **kwargs):
    """The compiled kernel of Gluon/Triton JIT function ``kernel`` for sm_90 with these arguments (CPU tensors
    will do: only dtypes and alignment count), without a GPU. Swaps Triton's active driver for the call: run it in a
    process of its own (:func:`check_gluon_kernels` does), not one that launches kernels."""
    from triton.runtime import driver

    saved = driver._active
    driver.set_active(_Sm90())
    try:
        return kernel.run(*args, grid=(1, 1), warmup=True, **kwargs)
    finally:
        driver._active = saved


def _lqq_launches():
    """(name, kernel, args, kwargs) of the LiquidQuant Gluon launches to check: the rule's kinds of tile."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels import lqq_wgmma, lqq_ws
    from quantkit.runtime.kernels.wgmma_common import gl, ws_maxnreg

    m, n, k = 1024, 4096, 4096
    a, sa = torch.zeros(m, k, dtype=torch.int8), torch.zeros(m, 1)
    w, p = torch.zeros(n, k // 8, dtype=torch.int32), torch.zeros(k // 128, n, dtype=torch.int32)
    cs, out = torch.zeros(n, dtype=torch.float16), torch.zeros(m, n, dtype=torch.float16)
    slots, tickets = torch.zeros(16), torch.zeros(16, dtype=torch.int32)
    for bm, tail, wg, split in [(128, 0, 1, 1), (128, 64, 2, 1), (64, 32, 1, 1), (64, 32, 2, 1), (32, 0, 1, 2)]:
        args = (a, sa, w, p, cs, out, slots, tickets, m, n, k, 1, n, w.shape[1], k // 256, k // 256 // split, 1,
                k // 128)
        yield (f"lqq_wgmma bm={bm} tail={tail} wg={wg} split={split}", lqq_wgmma._lqq_wgmma_kernel, args,
               dict(BM=bm, STAGES=3, SPLIT_K=split, BT=tail, WG=wg, COPIES=lqq_wgmma.one_copy_per_tile(tail, wg),
                    num_warps=4 * wg))
    layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)
    for tail, wg, per_sm in [(0, 1, 2), (64, 2, 1), (32, 1, 1)]:
        descs = (TensorDescriptor(a, [m, k], [k, 1], [128, 128], layout),
                 TensorDescriptor(a, [m, k], [k, 1], [max(tail, 8), 128], layout))
        yield (f"lqq_ws tail={tail} wg={wg}", lqq_ws._lqq_ws_kernel,
               descs + (sa, w, p, cs, out, m, n, 1, n, w.shape[1], k // 256, 1, k // 128),
               dict(BM=128, BT=tail, STAGES=3, WG=wg, num_warps=4 * wg, maxnreg=ws_maxnreg(wg, per_sm)))


def _w4a16_launches():
    """(name, kernel, args, kwargs) of the W4A16 Gluon launches to check, fp16 and bf16."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels import w4a16_wgmma, w4a16_ws
    from quantkit.runtime.kernels.wgmma_common import gl, ws_maxnreg

    m, n, k = 1024, 4096, 4096
    w, p = torch.zeros(n, k // 8, dtype=torch.int32), torch.zeros(k // 128, n, dtype=torch.int32)
    slots, tickets = torch.zeros(16), torch.zeros(16, dtype=torch.int32)
    for dtype in (torch.float16, torch.bfloat16):
        x, out = torch.zeros(m, k, dtype=dtype), torch.zeros(m, n, dtype=dtype)
        for bm, stages, split, wg in [(128, 3, 1, 1), (128, 3, 1, 2), (32, 3, 2, 1), (32, 3, 1, 2)]:
            yield (f"w4a16_wgmma {dtype} bm={bm} wg={wg} split={split}", w4a16_wgmma._w4a16_wgmma_kernel,
                   (x, w, p, out, slots, tickets, m, n, k, n, w.shape[1], k // 256, k // 256 // split, 1, k // 128),
                   dict(BM=bm, STAGES=stages, SPLIT_K=split, BF16=dtype == torch.bfloat16, WG=wg,
                        num_warps=4 * wg))
        layout = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        for wg in (1, 2):
            yield (f"w4a16_ws {dtype} wg={wg}", w4a16_ws._w4a16_ws_kernel,
                   (TensorDescriptor(x, [m, k], [k, 1], [128, 64], layout), w, p, out, m, n, n, w.shape[1],
                    k // 256, 1, k // 128),
                   dict(BM=128, STAGES=3, WG=wg, BF16=dtype == torch.bfloat16, num_warps=4 * wg,
                        maxnreg=ws_maxnreg(wg, 1)))


def check_gluon_kernels(workdir: str) -> dict[str, list[str]]:
    """Compile the register-operand Gluon kernels' launches (LiquidQuant: lqq_wgmma, lqq_ws; W4A16: w4a16_wgmma,
    w4a16_ws) for sm_90 into ``workdir`` and return launch → :func:`hazards`."""
    result = {}
    for i, (name, kernel, args, kwargs) in enumerate([*_lqq_launches(), *_w4a16_launches()]):
        compiled = compile_sm90(kernel, *args, **kwargs)
        path = os.path.join(workdir, f"kernel{i}.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        result[name] = hazards(path)
    return result


def main() -> int:
    """Print each launch's hazards; exit status 1 if any launch has one."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = check_gluon_kernels(tmp)
    for name, found in result.items():
        print(f"{name}: {len(found)} hazard(s)")
        for line in found[:5]:
            print("   ", line)
    bad = sum(bool(v) for v in result.values())
    print(f"{len(result)} launch(es), {bad} with hazards")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
