"""The CUDA LiquidQuant cluster kernel (quantkit/runtime/kernels/cuda/lqq_cluster.py): what it refuses runs
anywhere; its numbers run on a Hopper GPU with CuPy only, where they must equal the unsplit Triton LiquidQuant
kernel bit for bit (the cluster adds exact int32 partial sums, so any split gives the unsplit bits), call after call
(a missing cluster barrier would show as calls that differ)."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels.cuda.common import cupy_available  # noqa: E402
from quantkit.runtime.kernels.cuda.lqq_cluster import (CLUSTER_SPLITS, _cluster_split,  # noqa: E402
                                                        cluster_shared_bytes, lqq_cluster_matmul, lqq_cluster_problem)
from quantkit.runtime.kernels.gemm import CudaLqqCluster, int8_matmul, problem_for  # noqa: E402
from quantkit.runtime.kernels.registry import GemmProblem  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference  # noqa: E402
from quantkit.runtime.kernels.cuda import lqq_cluster as cuda_lqq_cluster  # noqa: E402
from tests.kernels_helpers import (DEVICE, a8_split, pretend_hopper, packed, planned_launch,  # noqa: E402
                                   record_kernel_launches, rel_err)

ON_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0) and cupy_available()
hopper = pytest.mark.skipif(not ON_HOPPER, reason="needs a GPU of compute capability >= 9.0 and CuPy")


def _acts(m: int, k: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def test_problem_names_what_the_kernel_cannot_take():
    _, tensors, meta = packed("w4a8-lqq", 64, 512, 128)
    codes, scales = _acts(8, 512, 0)
    problem = lambda **kw: lqq_cluster_problem(  # noqa: E731
        kw.get("codes", codes), kw.get("scales", scales), kw.get("group", -1), kw.get("layout", "w4a8-lqq"),
        kw.get("tensors", tensors), kw.get("meta", meta), kw.get("dtype", torch.float16), kw.get("out"))
    assert problem(layout="w8") == "layout w8 is not w4a8-lqq"
    assert problem(group=128) == "activations are not per-token"
    assert "not a multiple of 256" in problem(meta={**meta, "in_features": 384})
    assert "fp16/bf16" in problem(dtype=torch.float32)
    shifted = torch.zeros(8, 513, dtype=torch.int8, device=DEVICE)[:, 1:]  # rows start one byte off 16
    assert "16-byte aligned" in problem(codes=shifted)
    assert "float32 [M, 1]" in problem(scales=scales.double())
    assert "out must be" in problem(out=torch.empty(8, 63, dtype=torch.float16, device=DEVICE))
    assert "channel scales" in problem(tensors={**tensors, "channel_scales": tensors["channel_scales"].float()})
    assert "channel scales" in problem(tensors={**tensors, "channel_scales": tensors["channel_scales"][:32]})
    assert "group size 64" in problem(meta={**meta, "group_size": 64})
    assert "qweight [N, K/8]" in problem(tensors={**tensors, "qweight": tensors["qweight"][:, :32]})
    assert "qparams [groups, N]" in problem(tensors={**tensors, "qparams": tensors["qparams"][:, :32]})
    assert "float32 [M, 1]" in problem(scales=scales.expand(8, 2))
    assert "no tokens" in problem(codes=codes[:0], scales=scales[:0])
    assert "out must be" in problem(out=torch.empty(8, 64, dtype=torch.float16, device=DEVICE).t().contiguous().t())
    assert "tokens must be one of" in lqq_cluster_problem(codes, scales, -1, "w4a8-lqq", tensors, meta,
                                                          torch.float16, launch_cfg=(32, 4, 2))
    if not torch.cuda.is_available():
        assert problem() == "activations are not on a CUDA device"


def test_matmul_refuses_launches_it_has_no_instance_for():
    _, tensors, meta = packed("w4a8-lqq", 64, 256, 128)
    codes, scales = _acts(8, 256, 0)
    for launch in [(32, 4, 2), (128, 3, 2), (128, 16, 2), (64, 2, 5), (64, 2, 1), (64, 2, 3, 3), (64, 2, 3, 0),
                   (64, 2, 3, 2, 96)]:
        with pytest.raises(ValueError, match="tokens must be one of"):
            lqq_cluster_matmul(codes, scales, tensors, meta, *launch)
    for launch, why in [((64, 2, 2, 2), "at least 3 stages"), ((64, 2, 3, 1, 128), "need depth 2"),
                        ((128, 2, 4, 2, 128), "234496 bytes of shared memory")]:
        with pytest.raises(ValueError, match=why):
            lqq_cluster_matmul(codes, scales, tensors, meta, *launch)
        assert why in lqq_cluster_problem(codes, scales, -1, "w4a8-lqq", tensors, meta, torch.float16,
                                          launch_cfg=launch)


def test_shared_memory_of_the_largest_launch_fits_a_hopper_block():
    # a stage of 64 tokens: 16384 + 12288 + 512 bytes, rounded up to 29 KiB; one more KiB to align the first
    assert cluster_shared_bytes(64, 2) == 2 * 29 * 1024 + 1024
    assert cluster_shared_bytes(128, 4) <= 227 * 1024  # sm_90's opt-in limit per block
    assert cluster_shared_bytes(128, 3, 128) == 3 * 57 * 1024 + 1024  # 32768 + 24576 + 1024 bytes a stage
    # the partial tile [tokens][rows + 4] of int32 that the ring holds at the end (the kernel's static_assert)
    for tokens in (64, 128):
        for rows, stages in ((64, 2), (128, 3)):
            assert cluster_shared_bytes(tokens, stages, rows) - 1024 >= tokens * (rows + 4) * 4


def test_cluster_split_gives_every_cta_a_tile_and_has_an_instance():
    assert _cluster_split(16, 8) == (2, 8)
    assert _cluster_split(14, 8) == (4, 4)  # 7 splits of 2 have no instance: 4, 4, 4, 2
    assert _cluster_split(5, 4) == (3, 2)  # split_plan's 3 (2, 2, 1) has no instance: 2 (3, 2)
    for n_tiles in range(1, 40):
        for split in CLUSTER_SPLITS:
            per, got = _cluster_split(n_tiles, split)
            assert got in CLUSTER_SPLITS and got <= split and (got - 1) * per < n_tiles <= got * per


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("n,k,m,tokens,split,stages,depth,rows", [
    (1024, 4096, 256, 128, 4, 2, 1, 64), (1024, 4096, 192, 64, 8, 2, 1, 64), (1024, 4096, 1, 64, 4, 3, 1, 64),
    (1024, 4096, 384, 128, 4, 4, 1, 64),
    (512, 3584, 300, 128, 2, 3, 1, 64),   # 14 tiles in 2
    (512, 3584, 130, 64, 8, 4, 1, 64),    # 14 tiles asked in 8: 4 splits of 4, 4, 4, 2
    (200, 512, 33, 64, 2, 2, 1, 64),  # odd N (a part-filled last row block)
    (333, 1280, 3, 128, 4, 3, 1, 64),  # odd N; 5 tiles
    (72, 256, 129, 128, 1, 2, 1, 64),     # one tile, no split; a ragged last token tile (zero-filled rows)
    (1000, 2048, 511, 128, 8, 3, 1, 64), (2048, 4096, 200, 64, 2, 3, 1, 64),
    # two tiles' products in flight: 1, 2, 3, 4, 5, 7, 8 and 16 tiles a CTA (the loop's three register sets, every
    # remainder of its unrolling), 3 and 4 stages
    (1024, 4096, 700, 128, 1, 3, 2, 64), (1024, 4096, 513, 64, 2, 3, 2, 64), (1000, 2048, 300, 128, 2, 4, 2, 64),
    (333, 1280, 65, 64, 1, 3, 2, 64), (512, 3584, 200, 64, 4, 4, 2, 64), (72, 256, 129, 128, 1, 3, 2, 64),
    (200, 512, 33, 64, 1, 3, 2, 64), (256, 3072, 100, 64, 4, 3, 2, 64), (2048, 4096, 769, 128, 4, 3, 2, 64),
    (512, 3584, 900, 128, 2, 4, 2, 64),
    # two warpgroups (128 weight rows) sharing each stage: odd N ending inside the second warpgroup's rows, too
    (1024, 4096, 769, 128, 2, 3, 2, 128), (1024, 4096, 513, 64, 2, 4, 2, 128), (333, 1280, 65, 64, 1, 3, 2, 128),
    (200, 512, 33, 128, 1, 3, 2, 128), (2048, 4096, 300, 64, 4, 3, 2, 128), (512, 3584, 900, 128, 2, 3, 2, 128),
    (72, 256, 129, 128, 1, 3, 2, 128)])  # the second warpgroup's rows all past N
def test_cluster_kernel_equals_unsplit_triton_call_after_call(n, k, m, tokens, split, stages, depth, rows):
    """Bit for bit the unsplit Triton kernel (the same exact int32 sum and epilogue), call after call, into a
    row-strided output, in bf16 too; near the pure-torch reference."""
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
    codes, scales = _acts(m, k, seed=m + split)
    assert lqq_cluster_problem(codes, scales, -1, "w4a8-lqq", tensors, meta, torch.float16,
                               launch_cfg=(tokens, split, stages, depth, rows)) is None
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, 128, 1, 4, 3))
    for _ in range(4):
        # a row-strided output inside a NaN buffer one row and 8 columns larger: nothing is written outside [M, N]
        buf = torch.full((m + 1, n + 8), float("nan"), dtype=torch.float16, device=DEVICE)
        got = lqq_cluster_matmul(codes, scales, tensors, meta, tokens, split, stages, depth, rows, out=buf[:m, :n])
        assert torch.equal(got, tri)
        assert buf[:, n:].isnan().all() and buf[m].isnan().all()
    assert rel_err(got, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3
    bf = lqq_cluster_matmul(codes, scales, tensors, meta, tokens, split, stages, depth, rows,
                            out_dtype=torch.bfloat16)
    assert bf.dtype == torch.bfloat16
    assert torch.equal(bf, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, out_dtype=torch.bfloat16,
                                       config=TileConfig(64, 128, 1, 4, 3)))


@pytest.mark.gpu
@hopper
def test_cluster_kernel_in_a_cuda_graph_replays_the_same_bits():
    """Captured once and replayed on new activations (what the bench and decode graphs do): each replay equals an
    eager call on the same inputs."""
    _, tensors, meta = packed("w4a8-lqq", 1024, 4096, 128, seed=3)
    codes, scales = _acts(256, 4096, seed=3)
    out = torch.empty(256, 1024, dtype=torch.float16, device=DEVICE)
    lqq_cluster_matmul(codes, scales, tensors, meta, 128, 4, 2, out=out)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lqq_cluster_matmul(codes, scales, tensors, meta, 128, 4, 2, out=out)
    for seed in (4, 5):
        new_codes, new_scales = _acts(256, 4096, seed=seed)
        codes.copy_(new_codes), scales.copy_(new_scales)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, lqq_cluster_matmul(codes, scales, tensors, meta, 128, 4, 2))


def _default_and_tune_launches() -> set:
    """Every (tokens, split, stages, depth, rows) of the cluster kernel's default rule and tune space on a Hopper GPU
    with 132 SMs, over layers of 512-28672 rows and 3584-14336 columns at 1-4096 tokens."""
    out = set()
    kernel = CudaLqqCluster()
    for n in (512, 1024, 2048, 4096, 6144, 14336, 28672):
        for k in (3584, 4096, 14336):
            for m in (1, 9, 16, 17, 40, 64, 65, 100, 128, 200, 256, 300, 512, 513, 768, 1024, 2048, 4096):
                p = GemmProblem("a8", ("w4a8-lqq",), m, n, k, -1, torch.float16, (9, 0), 132,
                                frozenset({"cupy", "gluon"}))
                picked = kernel.picks(p)[0]
                out.update((n, k, tuple(cfg)) for cfg in (kernel.configs(p) if picked else []) + kernel.candidates(p))
    return out


def test_int8_matmul_runs_the_rules_cluster_launch_else_falls_through(monkeypatch):
    """Without a GPU: where the cluster kernel's rule gives a launch, that launch reaches lqq_cluster_matmul; where
    the kernel cannot run the call (lqq_cluster_problem names a reason), int8_matmul goes on to the next kernels of
    its plan and still returns the product. (The rule itself is replaced: this checks the wiring, not its choice.)"""
    from quantkit.runtime.kernels import heuristic

    launch = (64, 4, 3, 2, 64)
    monkeypatch.setattr(heuristic, "lqq_cluster_launch", lambda m, n, k, sms: launch)
    pretend_hopper(monkeypatch)
    _, tensors, meta = packed("w4a8-lqq", 64, 3584, 128, seed=2)
    codes, scales = _acts(17, 3584, seed=2)
    assert planned_launch(monkeypatch, "a8", ("w4a8-lqq",), 17, 64, 3584, -1, torch.float16) == \
        ("cuda.lqq_cluster", launch)
    calls = []
    monkeypatch.setattr(cuda_lqq_cluster, "lqq_cluster_problem", lambda *a, **kw: None)
    monkeypatch.setattr(cuda_lqq_cluster, "lqq_cluster_matmul", lambda *a, **kw: calls.append(a[4:9]) or "cluster")
    assert int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta) == "cluster"
    assert calls == [launch]
    monkeypatch.setattr(cuda_lqq_cluster, "lqq_cluster_problem", lambda *a, **kw: "no CuPy")
    got = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)  # on a CPU the Triton kernel, interpreted
    assert calls == [launch]
    assert rel_err(got, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3


@pytest.mark.gpu
@hopper
def test_int8_matmul_runs_the_first_launch_of_its_plan_on_narrow_layers_with_the_triton_kernels_bits(monkeypatch):
    """With no tuned tables, int8_matmul runs the first launch of the registry's plan on narrow LiquidQuant layers
    (where the cluster kernel serves), with the Triton kernel's bits at that launch's K split (the cluster kernel's
    exact int32 sums: the unsplit bits); then every default and tune launch of the cluster kernel on those layers,
    through int8_matmul, gives the unsplit Triton bits too."""
    calls = record_kernel_launches(monkeypatch)
    for n, k, m in ((512, 3584, 40), (512, 3584, 300), (1024, 4096, 17), (1024, 4096, 100), (2048, 4096, 256),
                    (4096, 4096, 64)):
        _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=n + m)
        codes, scales = _acts(m, k, seed=m)
        launch = planned_launch(monkeypatch, "a8", ("w4a8-lqq",), m, n, k, -1, torch.float16)
        calls.clear()
        out = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta)
        assert calls == [launch], (n, k, m)
        assert rel_err(out, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < 1e-3
        split = a8_split(*launch)
        if split is not None:
            assert torch.equal(out, int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta,
                                                config=TileConfig(64, 128, split, 4, 3))), (n, k, m, launch)
        tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, 128, 1, 4, 3))
        p = problem_for("a8", ("w4a8-lqq",), m, n, k, -1, torch.float16, codes.device)
        kernel = CudaLqqCluster()
        if not kernel.can_implement(p)[0]:  # (a GPU newer than Hopper)
            continue
        for cfg in dict.fromkeys((kernel.configs(p) if kernel.picks(p)[0] else []) + kernel.candidates(p)):
            got = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, kernel=kernel.name, launch_config=cfg)
            assert torch.equal(got, tri), (n, k, m, cfg)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("group", [-1, 256, 384])  # one group a row (shift 31), a power of two, a division
def test_cluster_kernel_on_other_weight_groups(group):
    _, tensors, meta = packed("w4a8-lqq", 200, 1536, group, seed=7)
    codes, scales = _acts(70, 1536, seed=7)
    tri = int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(64, 128, 1, 4, 3))
    assert torch.equal(lqq_cluster_matmul(codes, scales, tensors, meta, 64, 4, 3), tri)


def _nvcc_and_cuobjdump() -> bool:
    import shutil

    from quantkit.bench.sass import cuobjdumps

    return shutil.which("nvcc") is not None and bool(cuobjdumps())


@pytest.mark.skipif(not _nvcc_and_cuobjdump(), reason="needs nvcc and cuobjdump (no GPU)")
def test_no_register_a_operand_is_overwritten_while_its_wgmma_runs(tmp_path):
    """The SASS of every instance the default rule and the tune space launch (with and without programmatic
    dependent launch, fp16 and bf16 outputs), built by nvcc for sm_90a: ptxas does not keep a register A operand
    alive past its wgmma's issue, so a write to one before the wait would race (quantkit.bench.sass). (The cubins
    the NVRTC of CuPy's wheel builds at run time could not be disassembled by the H100 machine's cuobjdump, so this
    checks the toolkit's ptxas.)"""
    import subprocess

    from quantkit.bench.sass import hazards, instructions, register_products
    from quantkit.runtime.kernels.cuda.common import PDL_DEFINE
    from quantkit.runtime.kernels.cuda.lqq_cluster import SOURCE, cluster_kernel_name

    args = ("const signed char*, const float*, int, long long, long long, const char*, const u32*, const __half*, "
            "int, int, int, int, int, void*, long long, int, int")
    # the instance each launch builds: its split as _cluster_split lowers it on K's tiles (14 tiles asked in 8: 4)
    instances = {(_cluster_split(k // 256, split)[1], tokens, stages, depth, rows)
                 for _, k, (tokens, split, stages, depth, rows) in _default_and_tune_launches()}
    for s, tokens, stages, depth, rows in sorted(instances):
        for bf16, source in ((False, SOURCE), (True, PDL_DEFINE + SOURCE)):  # each output and form once
            name = cluster_kernel_name(s, tokens, stages, bf16, depth, rows)
            (tmp_path / "k.cu").write_text(f"{source}\ntemplate __global__ void {name}({args});\n")
            subprocess.run(["nvcc", "-arch=sm_90a", "-cubin", "-std=c++17", "-o", str(tmp_path / "k.cubin"),
                            str(tmp_path / "k.cu")], check=True, capture_output=True)
            # the 8 planes of a tile (depth 2: the first tile's, then three register sets' in the loop)
            assert register_products(instructions(str(tmp_path / "k.cubin"))) == 8 * (1 + 3 * (depth - 1)), name
            assert hazards(str(tmp_path / "k.cubin")) == [], name
