"""Launch bookkeeping shared by the GEMM kernels: the Triton tile config, split-K ranges and group indexing in
half-tiles."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from quantkit.formats.kernel_common import HALF_K


@dataclass(frozen=True)
class TileConfig:
    """One launch of the Triton GEMM kernels: BN weight rows × BM tokens per program, ``split_k`` programs along K
    (the transposed product Y^T = W·X^T, LiquidGEMM Sec. 5.4: weight rows on the tensor core's M side)."""

    bn: int
    bm: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def to_dict(self) -> dict:
        """The config as a JSON-ready dict."""
        return asdict(self)


def split_plan(n_tiles: int, split_k: int) -> tuple[int, int]:
    """(tiles per split, number of splits) for ``split_k`` requested splits of ``n_tiles`` 256-column tiles; the
    count is reduced so that no split is empty."""
    split_k = max(1, min(int(split_k), max(n_tiles, 1)))
    per = -(-max(n_tiles, 1) // split_k)
    return per, -(-max(n_tiles, 1) // per)


def groups_in_halves(meta: dict, n_tiles: int) -> int:
    """Group size in 128-column half-tiles (half h belongs to group h // this); per-channel weights get a value
    larger than any half index, so every half maps to group 0."""
    gs = int(meta["group_size"])
    return 2 * n_tiles + 1 if gs == -1 else gs // HALF_K


def act_groups_in_halves(group_size: int, k: int) -> int:
    """The same for activation groups (per-token activations: -1)."""
    return 2 * (-(-k // HALF_K)) + 2 if group_size == -1 else group_size // HALF_K
