"""How much memory a device has free for new tensors: what the memory-hungry shortcuts (keeping activations for
backward, recording sub-block inputs for replay) ask before they take it."""

from __future__ import annotations

from pathlib import Path

import torch


def _meminfo_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (free memory plus reclaimable page cache), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom() -> int | None:
    """Bytes this process's cgroup (v2) may still allocate (memory.max - memory.current), or None when unlimited
    or unknown."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int(Path("/sys/fs/cgroup/memory.current").read_text().strip()))
    except (OSError, ValueError):
        return None


def free_memory(device: torch.device | str) -> int:
    """Bytes free for new tensors on ``device``: the GPU's free memory, or the host's available memory (free plus
    reclaimable cache, capped by a cgroup limit); 0 when it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    known = [b for b in (_meminfo_available(), _cgroup_headroom()) if b is not None]
    return min(known) if known else 0


def fits(nbytes: int, device: torch.device | str, share: float = 0.25) -> bool:
    """Whether ``nbytes`` of new tensors stay within ``share`` of the free memory of ``device``."""
    return nbytes <= share * free_memory(device)
