"""Output-channel partitions by bit-width (MixLLM Sec. 3.4): quantize the rows of each bit-width with its own
quantizer, and reassemble the dense dequantized weight for fake-quant and reference execution."""

from __future__ import annotations

from collections.abc import Callable

import torch

from quantkit.quant.grid import dequantize
from quantkit.quant.records import Partition, PartitionedWeight, QuantizedWeight

WeightRecord = QuantizedWeight | PartitionedWeight


def split_rows(row_bits: torch.Tensor) -> dict[int, torch.Tensor]:
    """Sorted row indices per bit-width of a per-row bit assignment [N]."""
    row_bits = torch.as_tensor(row_bits).reshape(-1).long().cpu()
    return {int(b): torch.nonzero(row_bits == b).flatten() for b in torch.unique(row_bits).tolist()}


def quantize_partitioned(weight: torch.Tensor, row_bits: torch.Tensor,
                         quantize_rows: Callable[[torch.Tensor, int], QuantizedWeight]) -> WeightRecord:
    """Quantize ``weight`` [N, K] with ``quantize_rows(sub_weight, bits)`` per bit-width; a single bit-width gives
    a plain :class:`QuantizedWeight`."""
    parts = split_rows(row_bits)
    if len(parts) == 1:
        (bits,) = parts
        return quantize_rows(weight, bits)
    return PartitionedWeight(
        out_features=weight.shape[0], in_features=weight.shape[1],
        partitions=[Partition(rows, quantize_rows(weight[rows.to(weight.device)], b)) for b, rows in parts.items()])


def dequantize_record(record: WeightRecord, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dense W^ [N, K] of a plain or partitioned record (partitions scattered back to their rows)."""
    if isinstance(record, QuantizedWeight):
        return dequantize(record, dtype)
    first = record.partitions[0].weight
    out = torch.empty(record.out_features, record.in_features, dtype=dtype, device=first.codes.device)
    for p in record.partitions:
        out[p.rows.to(out.device)] = dequantize(p.weight, dtype)
    return out


def record_to(record: WeightRecord, device: str | torch.device) -> WeightRecord:
    """The same record with every tensor on ``device`` (records leave the GPU layer by layer, so a large model's
    codes never pile up there)."""
    import dataclasses

    def move(qw: QuantizedWeight) -> QuantizedWeight:
        return dataclasses.replace(qw, **{f.name: getattr(qw, f.name).to(device) for f in dataclasses.fields(qw)
                                          if isinstance(getattr(qw, f.name), torch.Tensor)})

    if isinstance(record, QuantizedWeight):
        return move(record)
    return PartitionedWeight(record.out_features, record.in_features,
                             [Partition(p.rows.to(device), move(p.weight)) for p in record.partitions])


def record_bits(record: WeightRecord) -> tuple[int, int]:
    """(Σ bits × elements, elements) of a record — for average bit-width reports."""
    if isinstance(record, QuantizedWeight):
        n, k = record.codes.shape
        return record.bits * n * k, n * k
    total = sum(p.weight.bits * p.weight.codes.numel() for p in record.partitions)
    return total, record.out_features * record.in_features
