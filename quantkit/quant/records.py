"""The in-memory records every quantizer returns and every packer reads (../shared/ARCHITECTURE.md).

Conventions (one source of truth):

* ``codes`` are *unsigned* integers in [0, 2**bits - 1], shape [N, K] (out_features × in_features, the
  nn.Linear weight orientation), stored as uint8.
* dequantization is ``(codes - zeros[g]) * scales[g]`` where ``g = g_idx[k]`` is the group of input column k
  (MixLLM Sec. 3.1.2 / GPTQ / AWQ all use this affine form).
* symmetric quantization is the special case ``zeros = 2**(bits-1)`` with scale ``absmax / (2**(bits-1) - 1)``
  (codes then lie in [1, 2**bits - 1], as in MixLLM's sym-8 weights).
* ``scales`` are rounded to the storage dtype (fp16 by default) *before* codes are computed, so fake-quant and
  a packed checkpoint reload give bit-identical weights.
* FP8 weights (``fp8``): ``codes`` are the bit patterns of float8_e4m3fn values and dequantization is
  ``e4m3(codes) * scales[g]`` (zeros unused, all 0): the OCP FP8 E4M3 grid with a per-group (per-channel) scale
  absmax / 448, the FP8 W8A8 that vLLM and llm-compressor users deploy on Hopper.
* groups cover consecutive input columns (``g_idx = k // group_size``; the last group may be shorter when K is
  not a multiple of the group size) unless GPTQ act-order without static groups supplies its own ``g_idx``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class QuantizedWeight:
    """One quantized weight matrix (or one output-channel partition of it)."""

    codes: torch.Tensor  # uint8 [N, K]
    scales: torch.Tensor  # float [N, G]
    zeros: torch.Tensor  # uint8/int [N, G] integer zero points
    bits: int
    group_size: int  # -1 = one group per row (per-channel)
    sym: bool
    g_idx: torch.Tensor | None = None  # int32 [K] group of each input column; None = k // group_size
    # LiquidQuant two-level weights (LiquidGEMM Eq. 7-12): the codes are UINT4 second-level codes, ``scales`` and
    # ``zeros`` hold s_u8 and a = 128 + min(Q_i8) per group (as integers), and channel_scales the first-level
    # per-channel INT8 scale. None for ordinary one-level weights.
    channel_scales: torch.Tensor | None = None  # float [N]
    meta: dict = field(default_factory=dict)
    fp8: bool = False  # codes are float8_e4m3fn bit patterns (module docstring)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)  # type: ignore[return-value]

    @property
    def num_groups(self) -> int:
        return self.scales.shape[1]

    def group_index(self) -> torch.Tensor:
        """g_idx as a LongTensor [K] (the default consecutive grouping when none is stored)."""
        k = self.codes.shape[1]
        if self.g_idx is not None:
            return self.g_idx.long()
        gs = k if self.group_size == -1 else self.group_size
        return torch.arange(k, device=self.codes.device) // gs


@dataclass
class Partition:
    """Rows ``rows`` (output channels, sorted ascending) of a linear layer, quantized at one bit-width."""

    rows: torch.Tensor  # int64 [n_rows]
    weight: QuantizedWeight


@dataclass
class PartitionedWeight:
    """A linear layer whose output channels are split by bit-width (MixLLM Sec. 3.4): each partition is an
    ordinary quantized sub-matrix plus the output indices its results scatter to."""

    out_features: int
    in_features: int
    partitions: list[Partition]

    def bits_per_row(self) -> torch.Tensor:
        out = torch.zeros(self.out_features, dtype=torch.int64)
        for p in self.partitions:
            out[p.rows] = p.weight.bits
        return out
