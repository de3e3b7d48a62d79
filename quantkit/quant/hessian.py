"""The layer-wise Hessian of GPTQ and its damped inverse Cholesky factor.

GPTQ (Frantar et al. 2022) Sec. 3 quantizes a linear layer W to minimise ||W X - Ŵ X||², whose Hessian with
respect to each row of W is H = 2 X Xᵀ (X = the layer's inputs, one column per token). Sec. 4 "Step 3"
(Cholesky reformulation) needs only the upper Cholesky factor of H⁻¹, computed after dampening
H + λI with λ = percdamp · mean(diag H).
"""

from __future__ import annotations

import torch

from quantkit.errors import QuantkitError

# Each failed factorisation multiplies the dampening by 10; five tries go from 1% to 100x the mean diagonal,
# beyond which the Hessian is not a Hessian of real inputs any more (NaN/inf or a bug upstream).
DAMP_GROWTH = 10.0
MAX_DAMP_TRIES = 5


class HessianAccumulator:
    """Running H = 2/n · Σ_t x_t x_tᵀ over all n input rows (tokens) seen so far, in float32.

    GPTQ Sec. 3 (H = 2XXᵀ); kept as a running *mean* (the GPTQ reference rescales by n_old/n_new before each
    batch) so that thousands of calibration tokens do not grow the entries without bound. The scale of H does
    not change GPTQ's result: dampening is relative to mean(diag H).
    """

    def __init__(self, in_features: int, device: torch.device | str | None = None):
        self.in_features = int(in_features)
        self.hessian = torch.zeros(self.in_features, self.in_features, dtype=torch.float32, device=device)
        self.count = 0

    @torch.no_grad()
    def add(self, inputs: torch.Tensor) -> None:
        """Fold a batch of inputs [..., K] (any float dtype, any leading shape) into the running mean."""
        if inputs.shape[-1] != self.in_features:
            raise ValueError(f"inputs have {inputs.shape[-1]} features, the Hessian is for {self.in_features}")
        x = inputs.reshape(-1, self.in_features).to(device=self.hessian.device, dtype=torch.float32)
        n = x.shape[0]
        if n == 0:
            return
        total = self.count + n
        self.hessian.mul_(self.count / total)
        self.hessian.addmm_(x.t(), x, alpha=2.0 / total)
        self.count = total

    @torch.no_grad()
    def reduce_across_processes(self) -> None:
        """Make this the Hessian of every data-parallel process's inputs together (:mod:`quantkit.distributed`):
        the count-weighted mean of the processes' running means; a no-op in one process."""
        from quantkit import distributed

        if distributed.world_size() == 1:
            return
        weighted, count = distributed.sum_with_count(self.hessian * float(self.count), self.count)
        count = int(count)
        self.hessian = weighted / count if count else torch.zeros_like(self.hessian)
        self.count = count


def damped_inverse_cholesky(hessian: torch.Tensor, percdamp: float = 0.01, name: str = "",
                            max_tries: int = MAX_DAMP_TRIES) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor U of (H + λI)⁻¹ (so (H + λI)⁻¹ = UᵀU), λ = percdamp · mean(diag H) — GPTQ Sec. 4
    "Step 3". Returns (U, the percdamp actually used).

    A Hessian that is not positive definite after dampening (fp32 round-off on near-singular inputs) is retried
    with percdamp × 10, up to ``max_tries`` factorisations; then a :class:`QuantkitError` names the layer.
    """
    label = f" of {name}" if name else ""
    if not torch.isfinite(hessian).all():
        raise QuantkitError(f"GPTQ Hessian{label} has NaN/inf entries; the calibration activations overflowed "
                            "— run the layer in float32/bfloat16 or check the calibration data")
    if percdamp < 0:
        raise QuantkitError(f"GPTQ percdamp must be >= 0, got {percdamp}; use e.g. 0.01")
    mean_diag = hessian.diagonal().mean()
    damp = float(percdamp)
    for _ in range(max_tries):
        h = hessian.clone()
        h.diagonal().add_(damp * mean_diag)
        lower, info = torch.linalg.cholesky_ex(h)
        if int(info) == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0 and torch.isfinite(upper).all():
                return upper, damp
        damp = damp * DAMP_GROWTH if damp > 0 else 0.01
    raise QuantkitError(f"GPTQ Hessian{label} is not positive definite even with percdamp "
                        f"{damp / DAMP_GROWTH:g}; the calibration inputs are degenerate — use more or "
                        "different calibration samples, or a larger percdamp")
