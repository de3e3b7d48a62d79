"""Data-parallel calibration across processes (``torchrun --nproc-per-node N -m quantkit pack ...``), through
``torch.distributed``: every process holds the model and quantizes the same layers, each runs its share of the
calibration windows (window i goes to process i mod N), and what GPTQ learns from the windows is summed across the
processes before it is used — each linear's Hessian (GPTQ Sec. 3, H = 2XXᵀ, a count-weighted sum of the processes'
running means), the tokens each MoE expert received, and the input samples a clipping search scores — so every
process solves the same problems and holds the same records. Process 0 writes the checkpoint.

Under torchrun (``WORLD_SIZE`` > 1) :func:`setup` joins the process group (NCCL for CUDA devices, each process on
``cuda:LOCAL_RANK``; gloo on the CPU). Without it every function here is the one-process identity.
"""

from __future__ import annotations

import os

import torch

from quantkit.errors import QuantkitError


def world_size() -> int:
    """Processes in the data-parallel group (1 without one)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's index in the group (the launcher's ``RANK`` before the group is joined; 0 without one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def local_world_size() -> int:
    """Processes on this machine (the launcher's ``LOCAL_WORLD_SIZE``; 1 without one): they share its memory."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def is_main() -> bool:
    """Whether this process writes outputs (process 0, or the only one)."""
    return rank() == 0


def launched() -> bool:
    """Whether a launcher (torchrun, accelerate launch) started more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def setup(device: str) -> str:
    """Join the launcher's process group when there is one and return this process's compute device (``cuda:N``
    for a CUDA ``device``, N = ``LOCAL_RANK``); ``device`` itself otherwise."""
    import torch.distributed as dist

    if not launched():
        return device
    cuda = torch.device(device).type == "cuda"
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if local >= torch.cuda.device_count():
            raise QuantkitError(f"process {os.environ.get('RANK')} wants cuda:{local}, but this machine has "
                                f"{torch.cuda.device_count()} GPU(s); start at most that many processes")
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return device


def check_recipe(rec, samples: int) -> None:
    """Refuse, in one line, a recipe whose calibration is not split across processes — GPTQ's and AWQ's statistics
    are summed here (SmoothQuant's activation maxima and RTN's clipping search are not) — and fewer calibration
    windows than processes."""
    if world_size() == 1:
        return
    if not rec.uses_calibration:
        raise QuantkitError(f"recipe '{rec.name}' reads no calibration data, so there is nothing to split across "
                            f"{world_size()} processes; run it as one process")
    if rec.weight.method not in ("gptq", "awq") or rec.activation.smooth is not None:
        raise QuantkitError(f"data-parallel calibration runs GPTQ and AWQ recipes without SmoothQuant; recipe "
                            f"'{rec.name}' needs the whole calibration set in one process: run it without torchrun")
    if samples < world_size():
        raise QuantkitError(f"{world_size()} processes need at least as many calibration windows (got {samples}); "
                            f"use --calib-samples {world_size()} or more, or fewer processes")


def shard(ids: torch.Tensor) -> torch.Tensor:
    """This process's calibration windows: rows rank, rank + N, … of ``ids`` [n, T]."""
    return ids[rank()::world_size()]


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the processes (in place; returned). A CPU tensor in an NCCL group goes through this
    process's GPU (NCCL reduces device tensors only)."""
    import torch.distributed as dist

    if world_size() == 1:
        return t
    if t.device.type == "cpu" and dist.get_backend() == "nccl":
        on_gpu = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(on_gpu)
        t.copy_(on_gpu)
    else:
        dist.all_reduce(t)
    return t


def sum_with_count(total: torch.Tensor, count: float) -> tuple[torch.Tensor, float]:
    """(``total``, ``count``) summed over the processes (as they are alone): statistics every process accumulated
    over its share of the calibration tokens, with how many tokens that was."""
    if world_size() == 1:
        return total, count
    n = all_reduce_sum(torch.tensor([float(count)], dtype=torch.float64, device=total.device))
    return all_reduce_sum(total), float(n.item())


def broadcast_object(obj):
    """Process 0's ``obj`` on every process (picklable objects; ``obj`` itself alone), so that decisions every
    process must make alike — the order in which statistics are reduced — are made once."""
    import torch.distributed as dist

    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_tensors(items: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every process's ``items``, concatenated in process order (on this process's device)."""
    import torch.distributed as dist

    if world_size() == 1:
        return items
    device = items[0].device if items else torch.device("cpu")
    out: list = [None] * world_size()
    dist.all_gather_object(out, [t.cpu() for t in items])
    return [t.to(device) for part in out for t in part]


def barrier() -> None:
    """Wait for every process (a no-op alone)."""
    import torch.distributed as dist

    if world_size() > 1:
        dist.barrier()
