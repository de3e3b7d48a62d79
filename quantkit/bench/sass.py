"""The SASS of the Gluon wgmma kernels, without a GPU: compile a launch for sm_90 with the installed Triton (its
bundled ptxas) and look for writes to registers that a running register-sourced wgmma still reads.

Why: ptxas does not keep a register A operand alive while its asynchronous product runs, so a kernel can write such
registers (its next tile's planes and addresses) before the ``WARPGROUP.DEPBAR`` that retires the product and return
wrong sums (docs/BENCHMARKS.md). Tests pass most of the time on such a kernel; this check does not depend on timing.

:func:`hazards` walks a cubin's SASS over its control flow (:func:`hazards_in`): an IGMMA/HGMMA whose A operand
is registers adds those four registers to the open wgmma group, a GMMA marked ``gsb0`` closes the group,
``WARPGROUP.DEPBAR.LE gsb0, n`` retires all but the newest n groups, and any instruction whose destination
overlaps a group in flight is reported (a write's width from its opcode: .128 → 4 registers, .64/.WIDE → 2).
:func:`check_gluon_kernels` compiles the launches the launch rules use and checks each; ``python -m
quantkit.bench.sass`` prints the result.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys

# ops whose register operands are all read (their outputs are predicates, memory or nothing)
NO_REGISTER_OUTPUT = ("ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "PLOP3", "R2P", "ST", "RED", "BAR", "SYNCS",
                      "BRA", "BRX", "JMX", "WARPSYNC", "LDGSTS", "UTMA", "EXIT", "RET", "MEMBAR", "FENCE",
                      "WARPGROUP", "NOP", "DEPBAR", "CCTL", "ERRBAR")
STATES_PER_INSTRUCTION = 16  # distinct in-flight states walked through one instruction before it is left alone


def cuobjdumps() -> list[str]:
    """Every cuobjdump found: the one Triton ships (it matches the ptxas that built Triton's cubins), then the one on
    PATH and the CUDA toolkit's (which may read cubins of a newer NVRTC than Triton's)."""
    found = []
    spec = importlib.util.find_spec("triton")
    if spec is not None and spec.origin:
        bundled = os.path.join(os.path.dirname(spec.origin), "backends", "nvidia", "bin", "cuobjdump")
        if os.path.exists(bundled):
            found.append(bundled)
    for tool in (shutil.which("cuobjdump"), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin",
                                                           "cuobjdump")):
        if tool and os.path.exists(tool) and tool not in found:
            found.append(tool)
    return found


def cuobjdump() -> str | None:
    """The first of :func:`cuobjdumps`, else None."""
    tools = cuobjdumps()
    return tools[0] if tools else None


def instructions(cubin: str) -> list[tuple[int, str]]:
    """(address, instruction text) of every SASS instruction in the cubin file ``cubin``, from the first cuobjdump
    of :func:`cuobjdumps` that reads it (CalledProcessError from the last if none does)."""
    tools = cuobjdumps()
    if not tools:
        raise FileNotFoundError("no cuobjdump (Triton's, on PATH or in the CUDA toolkit)")
    for i, tool in enumerate(tools):
        run = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True, check=i == len(tools) - 1)
        if run.returncode == 0:
            out = run.stdout
            break
    return [(int(m.group(1), 16), m.group(2).strip()) for m in
            (re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line) for line in out.splitlines()) if m]


def _width(op: str) -> int:
    return 4 if ".128" in op else 2 if (".64" in op or ".WIDE" in op or ".S64" in op or op.startswith("CS2R")) else 1


def _parse(text: str) -> tuple[bool, str, list[str]]:
    """(predicated, opcode, operands) of one SASS instruction."""
    predicated = text.startswith("@")
    body = re.sub(r"^@!?U?P\w+\s+", "", text)
    op = body.split()[0]
    return predicated, op, [o.strip() for o in body[len(op):].split(",")] if body[len(op):].strip() else []


def _register_a(op: str, operands: list[str]) -> set[int]:
    """The registers a GMMA reads as its A operand (empty when A is a shared-memory descriptor)."""
    if "GMMA" not in op or len(operands) < 2 or not re.fullmatch(r"R\d+", operands[1]):
        return set()
    a = int(operands[1][1:])
    return set(range(a, a + 4))


def _written(op: str, operands: list[str]) -> set[int]:
    """General registers an instruction writes: its first plain register operand after any predicate outputs
    (``PT``, ``P0``, ``UP1``), unless the op writes none (:data:`NO_REGISTER_OUTPUT`)."""
    if op.split(".")[0].startswith(NO_REGISTER_OUTPUT) or "GMMA" in op:
        return set()
    for o in operands:
        if re.fullmatch(r"!?U?P(T|\d+)", o):
            continue
        m = re.fullmatch(r"R(\d+)(\.reuse)?", o)
        return set(range(int(m.group(1)), int(m.group(1)) + _width(op))) if m else set()
    return set()


def hazards(cubin: str) -> list[str]:
    """Writes to registers that an in-flight register-sourced wgmma reads in the cubin file ``cubin``, one line each
    (empty: none found); :func:`hazards_in` on its :func:`instructions`."""
    return hazards_in(instructions(cubin))


def register_products(code: list[tuple[int, str]]) -> int:
    """How many GMMAs in a SASS listing take their A operand from registers (a check that the listing parsed)."""
    return sum(bool(_register_a(*_parse(text)[1:])) for _, text in code)


def hazards_in(code: list[tuple[int, str]]) -> list[str]:
    """:func:`hazards` of a SASS listing, (address, instruction text) in address order: a walk over its control
    flow — both edges of a predicated branch, a region after every unconditional jump or exit started afresh (an
    indirect branch's targets are not known) — carrying the products in flight, in wgmma groups (a GMMA marked
    ``gsb0`` closes a group; ``WARPGROUP.DEPBAR.LE gsb0, n`` retires all but the newest n groups, a predicated one
    none). Each instruction is walked in at most :data:`STATES_PER_INSTRUCTION` distinct states."""
    index = {a: i for i, (a, _) in enumerate(code)}
    parsed = [_parse(text) for _, text in code]
    starts = [0] + [i + 1 for i, (pred, op, _) in enumerate(parsed)
                    if not pred and op.split(".")[0] in ("EXIT", "RET", "BRA", "BRX", "JMX") and i + 1 < len(code)]
    work = [(i, (), ()) for i in starts]  # (instruction, closed groups, open group): groups are (first addr, regs)
    seen: dict[int, set] = {}
    found: dict[tuple[int, int], str] = {}
    while work:
        i, closed, open_ = work.pop()
        states = seen.setdefault(i, set())
        if (closed, open_) in states or len(states) >= STATES_PER_INSTRUCTION:
            continue
        states.add((closed, open_))
        addr, text = code[i]
        pred, op, operands = parsed[i]
        regs = _register_a(op, operands)
        if "GMMA" in op:
            if regs:
                open_ = (open_[0] if open_ else addr, frozenset((open_[1] if open_ else frozenset()) | regs))
            if "gsb0" in operands and open_:
                closed, open_ = closed + (open_,), ()
        elif op.startswith("WARPGROUP.DEPBAR") and not pred:
            keep = int(operands[-1], 16)
            closed = closed + ((open_,) if open_ else ())
            open_ = ()
            closed = closed[len(closed) - keep:] if keep else ()
        else:
            written = _written(op, operands)
            for first, group in closed + ((open_,) if open_ else ()):
                if written & group:
                    found[(addr, first)] = f"{addr:#06x} {text}  (A operand of the products from {first:#06x})"
        base = op.split(".")[0]
        if base == "BRA":
            target = re.search(r"0x([0-9a-f]+)", " ".join(operands))
            if target and int(target.group(1), 16) in index:
                work.append((index[int(target.group(1), 16)], closed, open_))
            if pred and i + 1 < len(code):
                work.append((i + 1, closed, open_))
        elif (base in ("EXIT", "RET", "BRX", "JMX") and not pred) or i + 1 >= len(code):
            continue
        else:
            work.append((i + 1, closed, open_))
    return [found[key] for key in sorted(found)]


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

    from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma
    from quantkit.runtime.kernels.gluon_sm90 import lqq_ws
    from quantkit.runtime.kernels.gluon_sm90.common import gl, ws_maxnreg

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
    # every register budget, tail and stage count of the lqq_ws launches the registry may run (lqq_ws_kinds)
    for tail, wg, per_sm, stages in lqq_ws_kinds():
        descs = (TensorDescriptor(a, [m, k], [k, 1], [128, 128], layout),
                 TensorDescriptor(a, [m, k], [k, 1], [max(tail, 8), 128], layout))
        # a K split: the rules give lqq_ws none; its split epilogue is checked on one warpgroup and on two (each on
        # tickets of its own, with a tail tile: store_rows_split_pair)
        for split in (1, 2) if (tail, wg, per_sm) in ((0, 1, 2), (64, 2, 1)) else (1,):
            yield (f"lqq_ws tail={tail} wg={wg} per_sm={per_sm} stages={stages} split={split}", lqq_ws._lqq_ws_kernel,
                   descs + (sa, w, p, cs, out, slots, tickets, m, n, 1, n, w.shape[1], k // 256, k // 256 // split, 1,
                            k // 128, 0),
                   dict(BM=128, BT=tail, STAGES=stages, WG=wg, SPLIT_K=split, PART_REGS=lqq_ws.PART_REGS,
                        num_warps=4, maxnreg=ws_maxnreg(wg, per_sm)))
        if tail == 128:  # the 256-token launch with its last wave's tiles halved
            yield (f"lqq_ws tail={tail} wg={wg} per_sm={per_sm} stages={stages} halves", lqq_ws._lqq_ws_kernel,
                   descs + (sa, w, p, cs, out, slots, tickets, m, n, 1, n, w.shape[1], k // 256, k // 256, 1,
                            k // 128, 132),
                   dict(BM=128, BT=tail, STAGES=stages, WG=wg, SPLIT_K=1, PART_REGS=lqq_ws.PART_REGS, HALVES=True,
                        num_warps=4, maxnreg=ws_maxnreg(wg, per_sm)))
    # the K-pair launches (2 and 4 stages; unsplit, and a split for the slot epilogue)
    desc = TensorDescriptor(a, [m, k], [k, 1], [128, 128], layout)
    for stages in (2, 4):
        for split in (1, 2):
            yield (f"lqq_ws k_pair stages={stages} split={split}", lqq_ws._lqq_ws_kpair_kernel,
                   (desc, sa, w, p, cs, out, slots, tickets, m, n, 1, n, w.shape[1], k // 256, k // 256 // split, 1,
                    k // 128),
                   dict(BM=128, STAGES=stages, SPLIT_K=split, HALF_REGS=lqq_ws.PART_REGS, num_warps=4,
                        maxnreg=ws_maxnreg(2, 1)))


def lqq_ws_kinds() -> list[tuple[int, int, int, int]]:
    """(tail, warpgroups, programs an SM, stages) of every lqq_ws launch that the LiquidQuant Gluon kernel's default
    rule or tune space gives on layers of 512-28672 rows at 17-4096 tokens (:class:`.gemm.GluonLqq`)."""
    import torch

    from quantkit.runtime.kernels.gemm import GluonLqq
    from quantkit.runtime.kernels.gluon_sm90 import lqq_ws
    from quantkit.runtime.kernels.registry import GemmProblem

    kinds = set()
    for n in (512, 1024, 4096, 14336, 28672):
        for m in (17, 64, 130, 200, 300, 600, 1024, 2500, 4096):
            p = GemmProblem("a8", ("w4a8-lqq",), m, n, 4096, -1, torch.float16, (9, 0), 132,
                            frozenset({"cupy", "gluon"}))
            for c in GluonLqq().configs(p) + GluonLqq().candidates(p):
                if c.kernel in (lqq_ws.KERNEL, lqq_ws.HALVES_KERNEL):
                    _, stages, tail, wg, per_sm, _ = c.args
                    kinds.add((tail, wg, per_sm, stages))
    return sorted(kinds)


def _w4a16_launches():
    """(name, kernel, args, kwargs) of the W4A16 Gluon launches to check, fp16 and bf16."""
    import torch
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from quantkit.runtime.kernels.gluon_sm90 import w4a16_wgmma
    from quantkit.runtime.kernels.gluon_sm90 import w4a16_ws
    from quantkit.runtime.kernels.gluon_sm90.common import gl, ws_maxnreg

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
                   dict(BM=128, STAGES=3, WG=wg, BF16=dtype == torch.bfloat16, PART_REGS=w4a16_ws.PART_REGS,
                        num_warps=4, maxnreg=ws_maxnreg(wg, 1)))


def check_gluon_kernels(workdir: str) -> dict[str, tuple[int, list[str]]]:
    """Compile the register-operand Gluon kernels' launches (LiquidQuant: lqq_wgmma, lqq_ws; W4A16: w4a16_wgmma,
    w4a16_ws) for sm_90 into ``workdir``: launch → (register-sourced GMMAs in its SASS, :func:`hazards`)."""
    result = {}
    for i, (name, kernel, args, kwargs) in enumerate([*_lqq_launches(), *_w4a16_launches()]):
        compiled = compile_sm90(kernel, *args, **kwargs)
        path = os.path.join(workdir, f"kernel{i}.cubin")
        with open(path, "wb") as f:
            f.write(compiled.asm["cubin"])
        code = instructions(path)
        result[name] = (register_products(code), hazards_in(code))
    return result


def main() -> int:
    """Print each launch's hazards; exit status 1 if any launch has one or none of its GMMAs parsed."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        result = check_gluon_kernels(tmp)
    for name, (products, found) in result.items():
        print(f"{name}: {products} register-operand products, {len(found)} hazard(s)")
        for line in found[:5]:
            print("   ", line)
    bad = sum(bool(found) or not products for products, found in result.values())
    print(f"{len(result)} launch(es), {bad} with hazards or no products parsed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
