"""The GEMM entry points and the kernels the registry chooses between (:mod:`.registry`).

Three operations, each with one priority list (first = preferred where it can run):

* ``a8`` — int8 activation codes [M, K] with float32 scales × one packed weight (``w8``: W8A8; ``w4a16``: MixLLM
  W4A8; ``w4a8-lqq``: LiquidQuant W4A8):
  ``cuda.lqq_cluster`` → ``cuda.a8_gemv`` → ``gluon_sm90.lqq_ws_k_pair`` → ``gluon_sm90.lqq`` →
  ``gluon_sm90.w8a8`` → ``triton.int8``;
* ``a8_mixed`` — the same for a two-partition (4-bit + 8-bit rows) layer in one launch (MixLLM Sec. 3.4):
  ``cuda.a8_gemv`` → ``gluon_sm90.w8a8_mixed`` → ``triton.int8_mixed``;
* ``a16`` — fp16/bf16 activations × a ``w4a16`` weight:
  ``cuda.w4a16_gemv`` → ``gluon_sm90.w4a16_ws`` → ``gluon_sm90.w4a16_wgmma`` → ``triton.w4a16_dequant`` →
  ``triton.w4a16``.

The CUDA GEMVs serve decode sizes (a few tokens), the CUDA cluster kernel LiquidQuant layers with few output tiles,
the Gluon kernels Hopper above decode sizes, and the Triton kernels everything else (every GPU, and the CPU
interpreter). Where a tuned table (:mod:`.tables`) names a kernel and launch for the device and size, it runs
first; elsewhere each kernel's short rule (:mod:`.heuristic`, sized by the real SM count) decides whether it takes
the size and gives its launch. Each kernel's :meth:`~.registry.GemmKernel.candidates` is the launch space
``quantkit tune`` times. All of them compute the bits of the torch reference (:mod:`.reference`) for the same packed tensors,
up to the K split (fp32 partial sums added in another order).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from quantkit.runtime.kernels import heuristic as rules
from quantkit.runtime.kernels.cuda import gemv as cuda_gemv
from quantkit.runtime.kernels.cuda import gemv_a8 as cuda_gemv_a8
from quantkit.runtime.kernels.cuda import lqq_cluster as cuda_cluster
from quantkit.runtime.kernels.cuda.common import cupy_available
from quantkit.runtime.kernels.gluon_sm90 import common as gluon
from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma, lqq_ws, w4a16_wgmma, w4a16_ws, w8a8_wgmma
from quantkit.runtime.kernels.registry import (GemmKernel, GemmProblem, bind, device_traits, forced_kernel, register,
                                               run, run_config)
from quantkit.runtime.kernels.triton import int8_gemm as triton_int8
from quantkit.runtime.kernels.triton import w4a16 as triton_w4a16
from quantkit.runtime.kernels.triton.int8_operand import mixed_w8_operand, scale_group, w8_operand
from quantkit.runtime.kernels.triton.launch import TileConfig, split_plan

HOPPER = (9, 0)
HALF = (torch.float16, torch.bfloat16)


@dataclass
class A8Call:
    """The arguments of an ``a8``/``a8_mixed`` call: ``parts`` is [(layout, tensors, meta, rows)] (rows None for a
    single weight); ``config``/``use_asm``/``bn_b`` are the Triton kernels' overrides."""

    a_codes: torch.Tensor
    a_scales: torch.Tensor
    act_group: int
    parts: list
    out_features: int
    out_dtype: torch.dtype
    out: torch.Tensor | None = None
    config: object = None
    use_asm: bool | None = None
    bn_b: int | None = None
    ACTIVATIONS = ("a_codes", "a_scales")  # what a prepared launch's calls replace (registry.GemmKernel.bind)

    @property
    def one(self) -> tuple:
        """(layout, tensors, meta) of a single-weight call."""
        layout, tensors, meta, _ = self.parts[0]
        return layout, tensors, meta


@dataclass
class A16Call:
    """The arguments of an ``a16`` call."""

    x: torch.Tensor
    tensors: dict
    meta: dict
    out: torch.Tensor | None = None
    config: object = None
    use_asm: bool | None = None
    ACTIVATIONS = ("x",)


def _device_reason(p: GemmProblem, exact: tuple[int, int] | None = None, least: tuple[int, int] | None = None,
                   cupy: bool = False, gluon_needed: bool = False) -> str | None:
    if p.capability == (0, 0):
        return "needs a CUDA GPU"
    if exact is not None and p.capability != exact:
        return f"needs sm_{exact[0]}{exact[1]}, the device is sm_{p.capability[0]}{p.capability[1]}"
    if least is not None and p.capability < least:
        return f"needs sm_{least[0]}{least[1]} or newer"
    if cupy and "cupy" not in p.toolchains:
        return "needs CuPy (pip install cupy-cuda12x)"
    if gluon_needed and "gluon" not in p.toolchains:
        return "needs Triton's Gluon (triton >= 3.5)"
    return None


def _sms(p: GemmProblem) -> int:
    """The SM count the launch rules size waves by: the device's own (:data:`.heuristic.SMS_WITHOUT_GPU` where there
    is no GPU)."""
    return p.sms or rules.SMS_WITHOUT_GPU


def _splits(p: GemmProblem, programs: int, splits=(1, 2, 4, 8)) -> list[int]:
    """The K splits a tune tries for a launch of ``programs`` unsplit programs: 1, and the others where the launch has
    fewer programs than two waves and each split keeps :data:`.heuristic.MIN_SPLIT_TILES` tiles."""
    kt = rules.k_tiles(p.k)
    return [s for s in splits if s == 1 or (programs < 2 * _sms(p) and split_plan(kt, s)[0] >= rules.MIN_SPLIT_TILES)]


def _rule(cfg, what: str) -> tuple[bool, str]:
    return (True, "") if cfg else (False, f"not picked here by {what}")


class RuleKernel(GemmKernel):
    """A kernel whose launch rule both picks it and gives its one launch config: subclasses define
    ``rule(problem) -> config or None`` and name it in ``rule_name``."""

    rule_name = ""

    def picks(self, p):
        return _rule(self.rule(p), self.rule_name)

    def configs(self, p):
        cfg = self.rule(p)
        return [cfg] if cfg else []


# --- a8: CUDA ---------------------------------------------------------------------------------------------------

class CudaLqqCluster(RuleKernel):
    """LiquidQuant W4A8 with the K split reduced inside a thread-block cluster (:mod:`.cuda.lqq_cluster`), for
    layers with few output tiles from 9 tokens."""

    name, ops = "cuda.lqq_cluster", ("a8",)

    def can_implement(self, p):
        if p.layouts != ("w4a8-lqq",) or p.act_group != -1:
            return False, "LiquidQuant weights with per-token activations only"
        why = _device_reason(p, exact=HOPPER, cupy=True)
        if why:
            return False, why
        return True, ""

    rule_name = "heuristic.lqq_cluster_launch"

    def rule(self, p):
        return rules.lqq_cluster_launch(p.m, p.n, p.k, _sms(p))

    def candidates(self, p):
        if not 9 <= p.m <= 1024 or p.k % 256 or p.n > 6144:
            return []
        kt = rules.k_tiles(p.k)
        out = [(64, s, st, d, 64) for s in (2, 4, 8) if kt >= s for st, d in ((2, 1), (3, 1), (3, 2), (4, 2))]
        if kt >= 8:  # two warpgroups of rows; 128 tokens at three stages (four need more than a block's shared memory)
            out += [(64, 4, 4, 2, 128)] + ([(128, 4, 3, 2, 128)] if p.m > 64 else [])
        return out

    def accepts(self, p, c, cfg):
        layout, tensors, meta = c.one
        return cuda_cluster.lqq_cluster_problem(c.a_codes, c.a_scales, c.act_group, layout, tensors, meta,
                                                c.out_dtype, c.out, cfg)

    def launch(self, p, c, cfg):
        _, tensors, meta = c.one
        return cuda_cluster.lqq_cluster_matmul(c.a_codes, c.a_scales, tensors, meta, *cfg, out=c.out,
                                               out_dtype=c.out_dtype)


class CudaA8Gemv(GemmKernel):
    """The decode GEMV over int8 activations (:mod:`.cuda.gemv_a8`): one or two partitions, 1-16 tokens."""

    name, ops = "cuda.a8_gemv", ("a8", "a8_mixed")

    def can_implement(self, p):
        if not 1 <= p.m <= cuda_gemv_a8.A8_GEMV_MAX_M:
            return False, f"a decode GEMV: 1-{cuda_gemv_a8.A8_GEMV_MAX_M} tokens"
        why = _device_reason(p, least=(8, 0), cupy=True)
        if why:
            return False, why
        return True, ""

    def picks(self, p):
        return _rule(cuda_gemv_a8.a8_gemv_preferred(p.m, p.n, p.k, mixed=p.op == "a8_mixed", layouts=p.layouts),
                     "a8_gemv_preferred")

    def accepts(self, p, c, cfg):
        return cuda_gemv_a8.a8_gemv_problem(c.a_codes, c.a_scales, c.act_group, list(c.parts), c.out_dtype, c.out)

    def launch(self, p, c, cfg):
        return cuda_gemv_a8.a8_gemv_cuda(c.a_codes, c.a_scales, c.act_group, list(c.parts), c.out_features,
                                         c.out_dtype, c.out)

    def bind(self, p, c, cfg):
        if c.out is not None:
            return None
        return cuda_gemv_a8.BoundA8Gemv.create(c.a_codes, c.a_scales, c.act_group, list(c.parts), c.out_features,
                                               c.out_dtype)


# --- a8: Gluon (Hopper) -----------------------------------------------------------------------------------------

LQQ_TILES = ((32, 0), (64, 0), (64, 32), (128, 0), (128, 32), (128, 64))  # (tokens, tail) of the Gluon programs


class LqqLaunch(NamedTuple):
    """One LiquidQuant Gluon launch: the kernel (``lqq_ws_halves``, ``lqq_ws`` or ``lqq_wgmma``) and its
    arguments after the operands (see :func:`.gluon_sm90.lqq_ws.lqq_ws_matmul` /
    :func:`.gluon_sm90.lqq_wgmma.lqq_wgmma_matmul`)."""

    kernel: str
    args: tuple
    halves_from: int | None = None


def _lqq_gluon_reason(p: GemmProblem) -> str | None:
    if p.layouts != ("w4a8-lqq",) or p.act_group != -1:
        return "LiquidQuant weights with per-token activations only"
    if p.k % 256 or p.dtype not in HALF:
        return "needs K a multiple of 256 and an fp16/bf16 output"
    return _device_reason(p, exact=HOPPER, gluon_needed=True)


class GluonLqqKPair(GemmKernel):
    """LiquidQuant on the warp-specialized Gluon kernel, one program an SM over two K halves
    (:func:`.gluon_sm90.lqq_ws.lqq_ws_matmul` with ``k_pair``), where :func:`.heuristic.lqq_k_pair` picks it."""

    name, ops = "gluon_sm90.lqq_ws_k_pair", ("a8",)

    def can_implement(self, p):
        why = _lqq_gluon_reason(p)
        if why:
            return False, why
        return True, ""

    def picks(self, p):
        return _rule(rules.lqq_k_pair(p.m, p.n, p.k, _sms(p)), "heuristic.lqq_k_pair")

    def configs(self, p):
        return [(128, 4)]  # two ring slots a warpgroup

    def candidates(self, p):
        programs = rules.cdiv(p.n, 64) * rules.cdiv(p.m, 128)
        return [(128, 4), (128, 2)] if p.m >= 65 and p.k >= 512 and programs <= 2 * _sms(p) else []

    def accepts(self, p, c, cfg):
        layout, _, meta = c.one
        return (lqq_wgmma.lqq_wgmma_problem(c.a_codes, c.act_group, layout, meta, c.out, c.out_dtype, None)
                or gluon.kernel_broken(lqq_ws.K_PAIR_KERNEL))

    def launch(self, p, c, cfg):
        _, tensors, meta = c.one
        return gluon.launch_or_decline(lqq_ws.K_PAIR_KERNEL, (str(c.out_dtype), cfg[1]), lambda: lqq_ws.lqq_ws_matmul(
            c.a_codes, c.a_scales, tensors, meta, *cfg, out=c.out, out_dtype=c.out_dtype, k_pair=True),
            fallback="the next kernel of the priority list")


class GluonLqq(GemmKernel):
    """LiquidQuant on the Gluon wgmma kernels: the warp-specialized one (:mod:`.gluon_sm90.lqq_ws`: unsplit
    128-token programs, with a tail of up to 128 tokens, and 256-token launches whose last tiles may run as halves)
    and the plain one (:mod:`.gluon_sm90.lqq_wgmma`: 32-128-token tiles with tails up to 64, K splits); the launch
    of :func:`.heuristic.lqq_gluon_launch` by default."""

    name, ops = "gluon_sm90.lqq", ("a8",)

    def can_implement(self, p):
        why = _lqq_gluon_reason(p)
        if why:
            return False, why
        return True, ""

    def picks(self, p):
        return _rule(rules.lqq_gluon_launch(p.m, p.n, p.k, _sms(p)), "heuristic.lqq_gluon_launch")

    def configs(self, p):
        launch = rules.lqq_gluon_launch(p.m, p.n, p.k, _sms(p))
        if launch is None:
            return []
        form, args = launch
        if form == "wgmma":
            return [LqqLaunch(lqq_wgmma.KERNEL, args)]
        # the warp-specialized launch, and the same tile on the plain kernel where the first does not build here
        return [LqqLaunch(lqq_ws.KERNEL, args), LqqLaunch(lqq_wgmma.KERNEL, (128, 3, 1, 0, 1))]

    def candidates(self, p):
        m, n, sms = p.m, p.n, _sms(p)
        if m < 17:
            return []
        out = []
        for bm, tail in LQQ_TILES:
            tokens = bm + tail
            if tokens > m + 31 and tokens > 32:  # a tile past M by a whole 32-token chunk only loads padding
                continue
            if m > 256 and bm < 128:  # prefill sizes: fewer, wider programs dequantize less
                continue
            programs = rules.cdiv(n, 64) * rules.cdiv(m, tokens)
            if bm == 128:
                out.append(LqqLaunch(lqq_ws.KERNEL, (128, 3, tail, 1, 2 if tail == 0 else 1, 1)))
                if tail:
                    out.append(LqqLaunch(lqq_ws.KERNEL, (128, 3, tail, 2, 1, 1)))
                if tail and m > 512:
                    out.append(LqqLaunch(lqq_ws.KERNEL, (128, 2, tail, 1, 2, 1)))
            for split in _splits(p, programs):
                if bm < 128 or split > 1:
                    out.append(LqqLaunch(lqq_wgmma.KERNEL, (bm, 3, split, tail, 1)))
        if m > 256:  # 128 tokens + a 128-token tail on two warpgroups; its later tiles as two 128-token halves
            ws = (128, 3, 128, 2, 1, 1)
            tiles = rules.cdiv(n, 128) * rules.cdiv(m, 256)
            out.append(LqqLaunch(lqq_ws.KERNEL, ws))
            for h in dict.fromkeys((0, tiles // sms * sms)):
                if h < tiles:
                    out.append(LqqLaunch(lqq_ws.HALVES_KERNEL, ws, h))
        return out

    def config_to_json(self, config):
        return {"kernel": config.kernel, "args": list(config.args), "halves_from": config.halves_from}

    def config_from_json(self, data):
        return LqqLaunch(data["kernel"], tuple(data["args"]), data.get("halves_from"))

    def accepts(self, p, c, cfg):
        layout, _, meta = c.one
        why = lqq_wgmma.lqq_wgmma_problem(c.a_codes, c.act_group, layout, meta, c.out, c.out_dtype, None)
        if why:
            return why
        if cfg.kernel != lqq_wgmma.KERNEL and gluon.kernel_broken(lqq_ws.KERNEL):
            return gluon.kernel_broken(lqq_ws.KERNEL)
        return gluon.kernel_broken(cfg.kernel)

    def launch(self, p, c, cfg):
        _, tensors, meta = c.one
        key = (str(c.out_dtype),) + cfg.args
        if cfg.kernel == lqq_wgmma.KERNEL:
            return gluon.launch_or_decline(cfg.kernel, key, lambda: lqq_wgmma.lqq_wgmma_matmul(
                c.a_codes, c.a_scales, tensors, meta, *cfg.args, out=c.out, out_dtype=c.out_dtype))
        halves = {} if cfg.halves_from is None else {"halves_from": cfg.halves_from}
        return gluon.launch_or_decline(cfg.kernel, key, lambda: lqq_ws.lqq_ws_matmul(
            c.a_codes, c.a_scales, tensors, meta, *cfg.args, out=c.out, out_dtype=c.out_dtype, **halves),
            fallback="the next launch of the priority list")


class GluonW8a8(RuleKernel):
    """W8A8 on the TMA wgmma kernel (:mod:`.gluon_sm90.w8a8_wgmma`); MixLLM W4A8 from
    :data:`.heuristic.MIXLLM_OPERAND_MIN_M` tokens through its int8 operand (:mod:`.triton.int8_operand`)."""

    name, ops = "gluon_sm90.w8a8", ("a8",)

    def can_implement(self, p):
        if p.layouts not in (("w8",), ("w4a16",)):
            return False, "W8A8 and MixLLM W4A8 weights only"
        if p.layouts == ("w4a16",) and p.m < rules.MIXLLM_OPERAND_MIN_M:
            return False, f"MixLLM W4A8 takes the int8-operand path from {rules.MIXLLM_OPERAND_MIN_M} tokens"
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    rule_name = "heuristic.w8a8_gluon_launch"

    def rule(self, p):
        return rules.w8a8_gluon_launch(p.m, p.n, p.k, _sms(p), p.per_channel)

    def candidates(self, p):
        return _w8a8_candidates(p)

    def accepts(self, p, c, cfg):
        _, _, meta = c.one
        return w8a8_wgmma.w8a8_wgmma_problem(c.a_codes, c.act_group, "w8", meta, c.out, c.out_dtype)

    def launch(self, p, c, cfg):
        layout, tensors, meta = c.one
        return gluon.launch_or_decline(w8a8_wgmma.KERNEL, cfg, lambda: w8a8_wgmma.w8a8_wgmma_matmul(
            c.a_codes, c.a_scales, c.act_group, w8_operand(layout, tensors, meta), meta, *cfg, c.out, c.out_dtype))


class GluonW8a8Mixed(RuleKernel):
    """A mixed layer in one launch of the W8A8 TMA kernel, both partitions' int8 operands written in output-row
    order (:func:`.triton.int8_operand.mixed_w8_operand`), from :data:`.heuristic.MIXLLM_OPERAND_MIN_M` tokens:
    MixLLM W4.4A8 (4-bit + 8-bit g128 rows) and mixed LiquidQuant (LiquidQuant + per-channel 8-bit rows, per-token
    activations: one per-channel product)."""

    name, ops = "gluon_sm90.w8a8_mixed", ("a8_mixed",)

    def can_implement(self, p):
        if not all(lay in ("w8", "w4a16", "w4a8-lqq") for lay in p.layouts):
            return False, "MixLLM W4A8, LiquidQuant and W8A8 partitions only"
        if "w4a8-lqq" in p.layouts and p.act_group != -1:
            return False, "LiquidQuant rows with per-token activations only"
        if p.m < rules.MIXLLM_OPERAND_MIN_M:
            return False, f"takes layers from {rules.MIXLLM_OPERAND_MIN_M} tokens"
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    rule_name = "heuristic.w8a8_gluon_launch"

    def rule(self, p):
        return rules.w8a8_gluon_launch(p.m, p.n, p.k, _sms(p), p.per_channel)

    def candidates(self, p):
        return _w8a8_candidates(p)

    def accepts(self, p, c, cfg):
        if weight_group_of(c.parts) is None or len({int(pt[2]["in_features"]) for pt in c.parts}) != 1:
            return "partitions whose int8 operands differ in K or in the columns a scale covers"
        why = w8a8_wgmma.w8a8_wgmma_problem(c.a_codes, c.act_group, "w8", c.parts[0][2], c.out, c.out_dtype)
        if why is None and gluon.config_declined(w8a8_wgmma.KERNEL, cfg):
            why = "this launch did not build here"
        return why

    def launch(self, p, c, cfg):
        operand = mixed_w8_operand(list(c.parts), c.out_features)  # accepts checked the partitions match
        return gluon.launch_or_decline(w8a8_wgmma.KERNEL, cfg, lambda: w8a8_wgmma.w8a8_wgmma_matmul(
            c.a_codes, c.a_scales, c.act_group, *operand, *cfg, c.out, c.out_dtype))


def _w8a8_candidates(p: GemmProblem) -> list:
    """The W8A8 TMA kernel's tune space: 64-token tiles of 64 or 128 rows, each at its K splits; for per-channel
    products also 128×128 tiles of two warpgroups (three or four stages)."""
    if p.m < 17:
        return []
    tiles = rules.cdiv(p.m, 64)
    wide = [(128, 128, st, 8, False, 1) for st in (3, 4)] if p.per_channel else []
    return [(64, bn, 4, 4, True, s) for bn in (128, 64)
            for s in _splits(p, tiles * rules.cdiv(p.n, bn), (1, 2, 4))] + wide


# --- a8: Triton -------------------------------------------------------------------------------------------------

class TritonTiles(GemmKernel):
    """What the Triton GEMM kernels share: a :class:`.triton.launch.TileConfig` per launch
    (:func:`.heuristic.triton_tile` by default), and as tune candidates the default with half and twice its token
    tile (16-128 tokens, up to M), each row tile at the default's token tile and half of it, with other warps and
    stages on tiles of 64 tokens or more, and each K split."""

    def configs(self, p):
        return [rules.triton_tile(p.m, p.n, p.k, _sms(p))]

    def row_tiles(self, p: GemmProblem) -> tuple[int, ...]:
        """The weight-row tiles (BN) of this kernel's tune space."""
        return (64, 128)

    def candidates(self, p):
        rule = self.configs(p)[0]
        top = max(16, 1 << max(0, p.m - 1).bit_length())
        tiles = [rule] + [TileConfig(rule.bn, bm, rule.split_k, *rules.triton_warps_stages(rule.bn, bm))
                          for bm in (rule.bm // 2, rule.bm * 2) if 16 <= bm <= min(top, 128)]
        for bm in dict.fromkeys((rule.bm, max(16, rule.bm // 2))):
            for bn in self.row_tiles(p):
                if bn * bm > 256 * 64:
                    continue
                tiles.append(TileConfig(bn, bm, rule.split_k, *((8, 4) if bn == 256 else
                                                                 rules.triton_warps_stages(bn, bm))))
                tiles += [TileConfig(bn, bm, rule.split_k, w, st) for w, st in ((4, 3), (4, 4), (8, 3))
                          if bm >= 64 and bn <= 128 and (st == 3 or bm < 128)]
        tiles += [TileConfig(rule.bn, rule.bm, s, rule.num_warps, rule.num_stages)
                  for s in _splits(p, rules.cdiv(p.n, rule.bn) * rules.cdiv(p.m, rule.bm)) if s != rule.split_k]
        return list(dict.fromkeys(tiles))

    def config_to_json(self, config):
        return asdict(config)

    def config_from_json(self, data):
        return TileConfig(**data)


class TritonInt8(TritonTiles):
    """The Triton int8 tensor-core kernel (:mod:`.triton.int8_gemm`): every layout, activation group and GPU."""

    name, ops = "triton.int8", ("a8",)

    def row_tiles(self, p):
        # 256-row tiles for 4-bit weights only: four stages of 256 int8 rows take more shared memory than a block has
        return (64, 128) if p.layouts == ("w8",) else (64, 128, 256)

    def can_implement(self, p):
        return True, ""

    def launch(self, p, c, cfg):
        layout, tensors, meta = c.one
        return triton_int8.triton_int8_matmul(c.a_codes, c.a_scales, c.act_group, layout, tensors, meta,
                                              c.out_dtype, c.config or cfg, c.out, c.use_asm)

    def bind(self, p, c, cfg):
        if c.out is not None or c.use_asm is not None:
            return super().bind(p, c, cfg)
        layout, tensors, meta = c.one
        return (triton_int8.BoundTritonInt8.create(c.a_codes, c.a_scales, c.act_group, layout, tensors, meta,
                                                   c.out_dtype, c.config or cfg) or super().bind(p, c, cfg))


class TritonInt8Mixed(TritonTiles):
    """The Triton one-launch mixed kernel (:func:`.triton.int8_gemm.triton_mixed_int8_matmul`)."""

    name, ops = "triton.int8_mixed", ("a8_mixed",)

    def can_implement(self, p):
        return True, ""

    def launch(self, p, c, cfg):
        return triton_int8.triton_mixed_int8_matmul(c.a_codes, c.a_scales, c.act_group, list(c.parts),
                                                    c.out_features, c.out_dtype, c.config or cfg, c.out, c.bn_b)

    def bind(self, p, c, cfg):
        if c.out is not None:
            return super().bind(p, c, cfg)
        return (triton_int8.BoundTritonInt8.create_mixed(c.a_codes, c.a_scales, c.act_group, list(c.parts),
                                                         c.out_features, c.out_dtype, c.config or cfg, c.bn_b)
                or super().bind(p, c, cfg))


# --- a16 --------------------------------------------------------------------------------------------------------

class CudaW4a16Gemv(GemmKernel):
    """The W4A16 decode GEMV (:mod:`.cuda.gemv`), up to :data:`.cuda.gemv.CUDA_GEMV_MAX_M` tokens."""

    name, ops = "cuda.w4a16_gemv", ("a16",)

    def can_implement(self, p):
        if not 1 <= p.m <= 2 * cuda_gemv.TOKENS_PER_COLUMN:
            return False, f"a decode GEMV: 1-{2 * cuda_gemv.TOKENS_PER_COLUMN} tokens"
        why = _device_reason(p, least=(8, 0), cupy=True)
        if why:
            return False, why
        return True, ""

    def picks(self, p):
        return _rule(cuda_gemv.cuda_gemv_preferred(p.m, p.n, p.k), "cuda_gemv_preferred")

    def accepts(self, p, c, cfg):
        return cuda_gemv.cuda_gemv_problem(c.x, c.tensors, c.meta, c.out)

    def launch(self, p, c, cfg):
        return cuda_gemv.w4a16_gemv_cuda(c.x, c.tensors, c.meta, out=c.out)

    def bind(self, p, c, cfg):
        return None if c.out is not None else cuda_gemv.BoundW4a16Gemv.create(c.x, c.tensors, c.meta)


class GluonW4a16(RuleKernel):
    """What the two Gluon W4A16 kernels share: Hopper with Gluon, and the launch of
    :func:`.heuristic.w4a16_gluon_launch` where it names this kernel's ``form`` ("ws" or "wgmma")."""

    ops = ("a16",)
    form = ""
    rule_name = "heuristic.w4a16_gluon_launch"

    def can_implement(self, p):
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    def rule(self, p):
        launch = rules.w4a16_gluon_launch(p.m, p.n, p.k, _sms(p))
        return launch[1] if launch and launch[0] == self.form else None


class GluonW4a16Ws(GluonW4a16):
    """W4A16 on the warp-specialized Gluon kernel (:mod:`.gluon_sm90.w4a16_ws`)."""

    name, form = "gluon_sm90.w4a16_ws", "ws"

    def candidates(self, p):
        return [(3, 1), (3, 2)] if p.m > 32 else []

    def accepts(self, p, c, cfg):
        return w4a16_ws.w4a16_ws_problem(c.x, c.meta, c.out)

    def launch(self, p, c, cfg):
        return gluon.launch_or_decline(w4a16_ws.KERNEL, (str(c.x.dtype),) + cfg, lambda: w4a16_ws.w4a16_ws_matmul(
            c.x, c.tensors, c.meta, *cfg, out=c.out), fallback="the next kernel of the priority list")


class GluonW4a16Wgmma(GluonW4a16):
    """W4A16 on the Gluon wgmma kernel (:mod:`.gluon_sm90.w4a16_wgmma`)."""

    name, form = "gluon_sm90.w4a16_wgmma", "wgmma"

    def candidates(self, p):
        if p.m < 17:
            return []
        out = []
        for bm in (32, 64, 128):
            if (bm > p.m + 31 and bm > 32) or (p.m > 256 and bm < 128):
                continue
            for wg in (1, 2):
                programs = rules.cdiv(p.n, 64 * wg) * rules.cdiv(p.m, bm)
                out += [(bm, 3, s, wg) for s in _splits(p, programs, (1, 2))]
        return out

    def accepts(self, p, c, cfg):
        return w4a16_wgmma.w4a16_wgmma_problem(c.x, c.meta, c.out)

    def launch(self, p, c, cfg):
        # fp16 and bf16 build different kernels: each config is declined (or counts as launched) per dtype
        return gluon.launch_or_decline(w4a16_wgmma.KERNEL, (str(c.x.dtype),) + cfg,
                                       lambda: w4a16_wgmma.w4a16_wgmma_matmul(c.x, c.tensors, c.meta, *cfg, out=c.out))


class TritonW4a16Dequant(GemmKernel):
    """Ŵ dequantized once on the GPU (:func:`.triton.w4a16.w4a16_dequantize`, the GEMM kernel's bits), then
    cuBLAS: the prefill form, where the product is compute-bound."""

    name, ops = "triton.w4a16_dequant", ("a16",)

    def can_implement(self, p):
        return True, ""

    def picks(self, p):
        return _rule(p.m >= rules.DEQUANT_MIN_M, f"heuristic: from {rules.DEQUANT_MIN_M} tokens")

    def launch(self, p, c, cfg):
        w = triton_w4a16.w4a16_dequantize(c.tensors, c.meta, c.x.dtype, c.use_asm)
        return torch.matmul(c.x, w.t()) if c.out is None else torch.matmul(c.x, w.t(), out=c.out)


class TritonW4a16(TritonTiles):
    """The Triton W4A16 kernel (:mod:`.triton.w4a16`): every shape and GPU."""

    name, ops = "triton.w4a16", ("a16",)

    def can_implement(self, p):
        return True, ""

    def launch(self, p, c, cfg):
        return triton_w4a16.triton_w4a16_matmul(c.x, c.tensors, c.meta, c.config or cfg, c.out, c.use_asm)

    def bind(self, p, c, cfg):
        if c.out is not None or c.use_asm is not None:
            return super().bind(p, c, cfg)
        return triton_w4a16.BoundTritonW4a16.create(c.x, c.tensors, c.meta, c.config or cfg) or super().bind(p, c, cfg)


for _k in (CudaLqqCluster(), CudaA8Gemv(), GluonLqqKPair(), GluonLqq(), GluonW8a8(), GluonW8a8Mixed(), TritonInt8(),
           TritonInt8Mixed(), CudaW4a16Gemv(), GluonW4a16Ws(), GluonW4a16Wgmma(), TritonW4a16Dequant(), TritonW4a16()):
    register(_k)


# --- entry points -----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def problem_for(op: str, layouts: tuple[str, ...], m: int, n: int, k: int, act_group: int, dtype: torch.dtype,
                device: torch.device, weight_group: int | None = None) -> GemmProblem:
    """The :class:`.registry.GemmProblem` of a call on ``device`` (its capability and real SM count); cached, so a
    layer's calls at one token count share one problem."""
    cap, sms = device_traits(device)
    return GemmProblem(op, tuple(layouts), int(m), int(n), int(k), int(act_group), dtype, cap, sms, toolchains(),
                       device_name(device), weight_group)


def weight_group_of(parts: list) -> int | None:
    """The :attr:`.registry.GemmProblem.weight_group` of a layer's partitions ((layout, tensors, meta, rows)): their
    common operand scale group (:func:`.triton.int8_operand.scale_group`), None where they differ."""
    groups = {scale_group(layout, meta) for layout, _, meta, _ in parts}
    return groups.pop() if len(groups) == 1 else None


@functools.lru_cache(maxsize=16)
def device_name(device: torch.device) -> str:
    """The CUDA device's name (which tuned tables apply), "" for other devices."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_name(device)


def toolchains() -> frozenset[str]:
    """The optional kernel toolchains installed here: "cupy" (NVRTC through CuPy, with a CUDA device) and "gluon"."""
    return frozenset(name for name, ok in (("cupy", cupy_available()), ("gluon", gluon.HAVE_GLUON)) if ok)


def int8_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str, tensors: dict,
                meta: dict, out_dtype: torch.dtype = torch.float16, config=None, out: torch.Tensor | None = None,
                use_asm: bool | None = None, kernel: str | None = None, launch_config=None) -> torch.Tensor:
    """Y [M, N] (``out_dtype``) = dequant(A)·Ŵᵀ for int8 activation codes [M, K] with float32 scales [M, G]
    (:func:`quantkit.quant.act.quantize_activation_int`) and a ``w8``, ``w4a16`` (MixLLM W4A8) or ``w4a8-lqq``
    weight, by the kernel the ``a8`` priority list picks (module docstring). ``kernel`` names one kernel
    (``QUANTKIT_KERNEL`` does the same); a Triton ``config`` (:class:`.triton.launch.TileConfig`) or a ``use_asm`` value
    selects ``triton.int8``; ``kernel`` with ``launch_config`` runs that launch exactly (``quantkit tune``).
    Reference: :func:`.reference.int8_reference`."""
    triton_int8.check_act(a_codes, a_scales, act_group_size, int(meta["in_features"]))
    triton_int8.check_layout(layout)
    if config is not None or use_asm is not None:
        kernel = "triton.int8"
    call = A8Call(a_codes, a_scales, act_group_size, [(layout, tensors, meta, None)], int(meta["out_features"]),
                  out_dtype, out, config, use_asm)
    p = problem_for("a8", (layout,), a_codes.shape[0], int(meta["out_features"]), int(meta["in_features"]),
                    act_group_size, out_dtype, a_codes.device, scale_group(layout, meta))
    if launch_config is not None:
        return run_config(p, call, kernel, launch_config)
    return run(p, call, forced_kernel("a8", kernel))


def mixed_int8_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                      out_features: int, out_dtype: torch.dtype = torch.float16, config=None,
                      out: torch.Tensor | None = None, bn_b: int | None = None, launches: int | None = None,
                      kernel: str | None = None, launch_config=None) -> torch.Tensor:
    """Y [M, out_features] of a two-partition layer in one launch (MixLLM Sec. 3.4): ``parts`` is two (layout,
    tensors, meta, rows int32 output indices), sharing the activation codes; the ``a8_mixed`` priority list picks
    the kernel. ``kernel`` names one; ``config`` or ``bn_b`` (rows per program of the second partition) select
    ``triton.int8_mixed``; ``launches`` 1 is ``triton.int8_mixed`` too, 0 the A8 GEMV wherever its hard
    requirements hold (the Triton kernel where they do not)."""
    if len(parts) != 2:
        raise ValueError(f"the one-launch mixed kernel takes 2 partitions, got {len(parts)}")
    if launches not in (None, 0, 1):
        raise ValueError(f"launches must be 0, 1 or None, got {launches}")
    k = int(parts[0][2]["in_features"])
    triton_int8.check_act(a_codes, a_scales, act_group_size, k)
    for layout, *_ in parts:
        triton_int8.check_layout(layout)
    call = A8Call(a_codes, a_scales, act_group_size, list(parts), out_features, out_dtype, out, config, None, bn_b)
    p = problem_for("a8_mixed", tuple(pt[0] for pt in parts), a_codes.shape[0], out_features, k, act_group_size,
                    out_dtype, a_codes.device, weight_group_of(parts))
    if launch_config is not None:
        return run_config(p, call, kernel, launch_config)
    if launches == 0:
        gemv = CudaA8Gemv()
        if gemv.accepts(p, call, None) is None:
            return gemv.launch(p, call, None)
        kernel = "triton.int8_mixed"
    if launches == 1 or config is not None or bn_b is not None:
        kernel = "triton.int8_mixed"
    return run(p, call, forced_kernel("a8_mixed", kernel))


def w4a16_matmul(x: torch.Tensor, tensors: dict, meta: dict, config=None, out: torch.Tensor | None = None,
                 use_asm: bool | None = None, dequant: bool | None = None, kernel: str | None = None,
                 launch_config=None) -> torch.Tensor:
    """Y = X·Ŵᵀ [M, N] in x's dtype (fp16 or bf16) for a ``w4a16`` weight by the kernel the ``a16`` priority list
    picks (module docstring). ``kernel`` names one; ``dequant`` True is ``triton.w4a16_dequant``, False or a
    Triton ``config`` / ``use_asm`` value ``triton.w4a16``. Reference: :func:`.reference.w4a16_reference`."""
    triton_w4a16.check_input(x, tensors, meta)
    if dequant:
        kernel = "triton.w4a16_dequant"
    elif dequant is not None or config is not None or use_asm is not None:
        kernel = "triton.w4a16"
    call = A16Call(x, tensors, meta, out, config, use_asm)
    p = problem_for("a16", ("w4a16",), x.shape[0], int(meta["out_features"]), int(meta["in_features"]), 0, x.dtype,
                    x.device)
    if launch_config is not None:
        return run_config(p, call, kernel, launch_config)
    return run(p, call, forced_kernel("a16", kernel))


def bind_w4a16(x: torch.Tensor, tensors: dict, meta: dict):
    """:func:`w4a16_matmul` of this weight for activations like ``x`` prepared once (:func:`.registry.bind`):
    ``f(x) -> Y | None``, or None where the chosen kernel has no prepared form."""
    triton_w4a16.check_input(x, tensors, meta)
    p = problem_for("a16", ("w4a16",), x.shape[0], int(meta["out_features"]), int(meta["in_features"]), 0, x.dtype,
                    x.device)
    return bind(p, A16Call(x, tensors, meta), forced_kernel("a16", None))


def bind_int8(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list, out_features: int,
              out_dtype: torch.dtype):
    """:func:`int8_matmul` (one partition: ``parts`` [(layout, tensors, meta, None)]) or :func:`mixed_int8_matmul`
    (two, with their rows) prepared once for codes and scales like these (:func:`.registry.bind`):
    ``f(codes, scales) -> Y | None``, or None where the chosen kernel has no prepared form."""
    k = int(parts[0][2]["in_features"])
    triton_int8.check_act(a_codes, a_scales, act_group_size, k)
    for layout, *_ in parts:
        triton_int8.check_layout(layout)
    op = "a8" if len(parts) == 1 else "a8_mixed"
    call = A8Call(a_codes, a_scales, act_group_size, list(parts), out_features, out_dtype)
    p = problem_for(op, tuple(pt[0] for pt in parts), a_codes.shape[0], out_features, k, act_group_size, out_dtype,
                    a_codes.device, weight_group_of(parts))
    return bind(p, call, forced_kernel(op, None))
