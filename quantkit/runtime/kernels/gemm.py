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
interpreter). Each kernel's launch rule (:mod:`.configs`) both decides whether it takes a shape and gives its
launch config. All of them compute the bits of the torch reference (:mod:`.reference`) for the same packed tensors,
up to the K split (fp32 partial sums added in another order).
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch

from quantkit.runtime.kernels import configs
from quantkit.runtime.kernels.cuda import gemv as cuda_gemv
from quantkit.runtime.kernels.cuda import gemv_a8 as cuda_gemv_a8
from quantkit.runtime.kernels.cuda import lqq_cluster as cuda_cluster
from quantkit.runtime.kernels.cuda.common import cupy_available
from quantkit.runtime.kernels.gluon_sm90 import common as gluon
from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma, lqq_ws, w4a16_wgmma, w4a16_ws, w8a8_wgmma
from quantkit.runtime.kernels.registry import (GemmKernel, GemmProblem, device_traits, forced_kernel, register, run,
                                               run_config)
from quantkit.runtime.kernels.triton import int8_gemm as triton_int8
from quantkit.runtime.kernels.triton import w4a16 as triton_w4a16
from quantkit.runtime.kernels.triton.int8_operand import mixed_w8_operand, w8_operand

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
    """The SM count the launch rules size waves by: the device's own (the rules' reference, an H100's 132, where
    there is no GPU: the interpreter runs the configs a 132-SM GPU would)."""
    return p.sms or configs.SMS_H100


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

    rule_name = "configs.lqq_cluster_launch"

    def rule(self, p):
        return configs.lqq_cluster_launch(p.m, p.n, p.k)

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


# --- a8: Gluon (Hopper) -----------------------------------------------------------------------------------------

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
    (:func:`.gluon_sm90.lqq_ws.lqq_ws_matmul` with ``k_pair``), where :func:`.configs.lqq_k_pair` picks it."""

    name, ops = "gluon_sm90.lqq_ws_k_pair", ("a8",)

    def can_implement(self, p):
        why = _lqq_gluon_reason(p)
        if why:
            return False, why
        return True, ""

    def picks(self, p):
        return _rule(configs.lqq_wgmma_launch(p.m, p.n, p.k, _sms(p)) and configs.lqq_k_pair(p.m, p.n, p.k, _sms(p)),
                     "configs.lqq_k_pair")

    def configs(self, p):
        return [(128, configs.LQQ_K_PAIR_STAGES)]

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
    """LiquidQuant on the Gluon wgmma kernels (:mod:`.gluon_sm90.lqq_ws`, :mod:`.gluon_sm90.lqq_wgmma`) with the
    launch :func:`.configs.lqq_wgmma_launch` picks, then its one-warpgroup form; each as the warp-specialized
    kernel with halved last tiles where :func:`.configs.lqq_ws_halves` says so, else with whole tiles, else the
    non-specialized kernel (tails up to 64 tokens)."""

    name, ops = "gluon_sm90.lqq", ("a8",)

    def can_implement(self, p):
        why = _lqq_gluon_reason(p)
        if why:
            return False, why
        return True, ""

    def picks(self, p):
        return _rule(configs.lqq_wgmma_launch(p.m, p.n, p.k, _sms(p)), "configs.lqq_wgmma_launch")

    def configs(self, p):
        m, n, k = p.m, p.n, p.k
        out = []
        sms = _sms(p)
        picks = (configs.lqq_wgmma_launch(m, n, k, sms), configs.lqq_wgmma_launch(m, n, k, sms, max_warpgroups=1))
        for cfg, wg in [c for c in dict.fromkeys(picks) if c]:
            ws = configs.lqq_ws_launch(cfg, wg)
            halves = configs.lqq_ws_halves(m, n, k, ws, sms) if ws is not None else None
            if halves is not None:
                out.append(LqqLaunch(lqq_ws.HALVES_KERNEL, ws, halves))
            if ws is not None:
                out.append(LqqLaunch(lqq_ws.KERNEL, ws))
            if cfg[3] <= configs.LQQ_WGMMA_MAX_TAIL:  # the 256-token tiles run on lqq_ws only
                out.append(LqqLaunch(lqq_wgmma.KERNEL, cfg + (wg,)))
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
    :data:`.configs.MIXLLM_OPERAND_MIN_M` tokens through its int8 operand (:mod:`.triton.int8_operand`)."""

    name, ops = "gluon_sm90.w8a8", ("a8",)

    def can_implement(self, p):
        if p.layouts not in (("w8",), ("w4a16",)):
            return False, "W8A8 and MixLLM W4A8 weights only"
        if p.layouts == ("w4a16",) and p.m < configs.MIXLLM_OPERAND_MIN_M:
            return False, f"MixLLM W4A8 takes the int8-operand path from {configs.MIXLLM_OPERAND_MIN_M} tokens"
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    rule_name = "configs.w8a8_wgmma_config"

    def rule(self, p):
        return configs.w8a8_wgmma_config(p.m, p.n, p.k)

    def accepts(self, p, c, cfg):
        _, _, meta = c.one
        return w8a8_wgmma.w8a8_wgmma_problem(c.a_codes, c.act_group, "w8", meta, c.out, c.out_dtype)

    def launch(self, p, c, cfg):
        layout, tensors, meta = c.one
        return gluon.launch_or_decline(w8a8_wgmma.KERNEL, cfg, lambda: w8a8_wgmma.w8a8_wgmma_matmul(
            c.a_codes, c.a_scales, c.act_group, w8_operand(layout, tensors, meta), meta, *cfg, c.out, c.out_dtype))


class GluonW8a8Mixed(RuleKernel):
    """A W4.4A8 layer (MixLLM 4-bit + 8-bit rows) in one launch of the W8A8 TMA kernel, both partitions' int8
    operands written in output-row order (:func:`.triton.int8_operand.mixed_w8_operand`), from
    :data:`.configs.MIXLLM_MIXED_OPERAND_MIN_M` tokens."""

    name, ops = "gluon_sm90.w8a8_mixed", ("a8_mixed",)

    def can_implement(self, p):
        if not all(lay in ("w8", "w4a16") for lay in p.layouts):
            return False, "MixLLM W4A8 and W8A8 partitions only"
        if p.m < configs.MIXLLM_MIXED_OPERAND_MIN_M:
            return False, f"takes layers from {configs.MIXLLM_MIXED_OPERAND_MIN_M} tokens"
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    rule_name = "configs.w8a8_wgmma_config"

    def rule(self, p):
        return configs.w8a8_wgmma_config(p.m, p.n, p.k)

    def accepts(self, p, c, cfg):
        why = w8a8_wgmma.w8a8_wgmma_problem(c.a_codes, c.act_group, "w8", c.parts[0][2], c.out, c.out_dtype)
        if why is None and gluon.config_declined(w8a8_wgmma.KERNEL, cfg):
            why = "this launch did not build here"
        return why

    def launch(self, p, c, cfg):
        operand = mixed_w8_operand(list(c.parts), c.out_features)
        if operand is None:  # partitions of different K or group sizes
            return None
        return gluon.launch_or_decline(w8a8_wgmma.KERNEL, cfg, lambda: w8a8_wgmma.w8a8_wgmma_matmul(
            c.a_codes, c.a_scales, c.act_group, *operand, *cfg, c.out, c.out_dtype))


# --- a8: Triton -------------------------------------------------------------------------------------------------

class TritonTiles(GemmKernel):
    """What the Triton GEMM kernels share: a :class:`.configs.TileConfig` per launch, and as tune candidates the
    rule's tile with each other token tile (16-128 tokens, up to M) and each K split (1, 2, 4)."""

    def candidates(self, p):
        rule = self.configs(p)[0]
        top = max(16, 1 << max(0, p.m - 1).bit_length())
        tiles = [rule] + [configs.TileConfig(rule.bn, bm, rule.split_k, rule.num_warps, rule.num_stages)
                          for bm in (16, 32, 64, 128) if bm <= top and bm != rule.bm]
        tiles += [configs.TileConfig(rule.bn, rule.bm, s, rule.num_warps, rule.num_stages)
                  for s in (1, 2, 4) if s != rule.split_k and -(-p.k // 256) >= 4 * s]
        return tiles

    def config_to_json(self, config):
        return asdict(config)

    def config_from_json(self, data):
        return configs.TileConfig(**data)


class TritonInt8(TritonTiles):
    """The Triton int8 tensor-core kernel (:mod:`.triton.int8_gemm`): every layout, activation group and GPU."""

    name, ops = "triton.int8", ("a8",)

    def can_implement(self, p):
        return True, ""

    def configs(self, p):
        return [configs.gemm_config(p.m, p.n, p.k, triton_int8.KIND[triton_int8.MODES[p.layouts[0]]], _sms(p))]

    def launch(self, p, c, cfg):
        layout, tensors, meta = c.one
        return triton_int8.triton_int8_matmul(c.a_codes, c.a_scales, c.act_group, layout, tensors, meta,
                                              c.out_dtype, c.config or cfg, c.out, c.use_asm)


class TritonInt8Mixed(TritonTiles):
    """The Triton one-launch mixed kernel (:func:`.triton.int8_gemm.triton_mixed_int8_matmul`)."""

    name, ops = "triton.int8_mixed", ("a8_mixed",)

    def can_implement(self, p):
        return True, ""

    def configs(self, p):
        return [configs.gemm_config(p.m, p.n, p.k, "mixed", _sms(p))]

    def launch(self, p, c, cfg):
        return triton_int8.triton_mixed_int8_matmul(c.a_codes, c.a_scales, c.act_group, list(c.parts),
                                                    c.out_features, c.out_dtype, c.config or cfg, c.out, c.bn_b)


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


class GluonW4a16Ws(RuleKernel):
    """W4A16 on the warp-specialized Gluon kernel (:mod:`.gluon_sm90.w4a16_ws`)."""

    name, ops = "gluon_sm90.w4a16_ws", ("a16",)

    def can_implement(self, p):
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    rule_name = "configs.w4a16_ws_warpgroups"

    def rule(self, p):
        wg = configs.w4a16_ws_warpgroups(p.m, p.n, p.k, _sms(p))
        return (3, wg) if wg else None

    def accepts(self, p, c, cfg):
        return w4a16_ws.w4a16_ws_problem(c.x, c.meta, c.out)

    def launch(self, p, c, cfg):
        return gluon.launch_or_decline(w4a16_ws.KERNEL, (str(c.x.dtype),) + cfg, lambda: w4a16_ws.w4a16_ws_matmul(
            c.x, c.tensors, c.meta, *cfg, out=c.out), fallback="the next kernel of the priority list")


class GluonW4a16Wgmma(RuleKernel):
    """W4A16 on the Gluon wgmma kernel (:mod:`.gluon_sm90.w4a16_wgmma`)."""

    name, ops = "gluon_sm90.w4a16_wgmma", ("a16",)

    def can_implement(self, p):
        why = _device_reason(p, exact=HOPPER, gluon_needed=True)
        if why:
            return False, why
        return True, ""

    rule_name = "configs.w4a16_wgmma_config"

    def rule(self, p):
        return configs.w4a16_wgmma_config(p.m, p.n, p.k)

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
        return _rule(configs.w4a16_dequant_preferred(p.m, p.n, p.k), "configs.w4a16_dequant_preferred")

    def launch(self, p, c, cfg):
        w = triton_w4a16.w4a16_dequantize(c.tensors, c.meta, c.x.dtype, c.use_asm)
        return torch.matmul(c.x, w.t()) if c.out is None else torch.matmul(c.x, w.t(), out=c.out)


class TritonW4a16(TritonTiles):
    """The Triton W4A16 kernel (:mod:`.triton.w4a16`): every shape and GPU."""

    name, ops = "triton.w4a16", ("a16",)

    def can_implement(self, p):
        return True, ""

    def configs(self, p):
        return [configs.gemm_config(p.m, p.n, p.k, "w4a16", _sms(p))]

    def launch(self, p, c, cfg):
        return triton_w4a16.triton_w4a16_matmul(c.x, c.tensors, c.meta, c.config or cfg, c.out, c.use_asm)


for _k in (CudaLqqCluster(), CudaA8Gemv(), GluonLqqKPair(), GluonLqq(), GluonW8a8(), GluonW8a8Mixed(), TritonInt8(),
           TritonInt8Mixed(), CudaW4a16Gemv(), GluonW4a16Ws(), GluonW4a16Wgmma(), TritonW4a16Dequant(), TritonW4a16()):
    register(_k)


# --- entry points -----------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=4096)
def problem_for(op: str, layouts: tuple[str, ...], m: int, n: int, k: int, act_group: int, dtype: torch.dtype,
                device: torch.device) -> GemmProblem:
    """The :class:`.registry.GemmProblem` of a call on ``device`` (its capability and real SM count); cached, so a
    layer's calls at one token count share one problem."""
    cap, sms = device_traits(device)
    return GemmProblem(op, tuple(layouts), int(m), int(n), int(k), int(act_group), dtype, cap, sms, toolchains(),
                       device_name(device))


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
    (``QUANTKIT_KERNEL`` does the same); a Triton ``config`` (:class:`.configs.TileConfig`) or a ``use_asm`` value
    selects ``triton.int8``; ``kernel`` with ``launch_config`` runs that launch exactly (``quantkit tune``).
    Reference: :func:`.reference.int8_reference`."""
    triton_int8.check_act(a_codes, a_scales, act_group_size, int(meta["in_features"]))
    triton_int8.check_layout(layout)
    if config is not None or use_asm is not None:
        kernel = "triton.int8"
    call = A8Call(a_codes, a_scales, act_group_size, [(layout, tensors, meta, None)], int(meta["out_features"]),
                  out_dtype, out, config, use_asm)
    p = problem_for("a8", (layout,), a_codes.shape[0], int(meta["out_features"]), int(meta["in_features"]),
                    act_group_size, out_dtype, a_codes.device)
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
                    out_dtype, a_codes.device)
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
