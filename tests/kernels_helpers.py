"""Shared by tests/runtime/kernels/test_kernels_*.py: the device the kernels run on (CUDA, else Triton's CPU interpreter — the
importing test module must set TRITON_INTERPRET before triton is imported), random records packed in the
kernel layouts, and the comparison rule."""

from __future__ import annotations

import torch

from quantkit.formats import get_layout
from quantkit.quant import grid
from quantkit.quant.lqq import lqq_quantize

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def packed(layout: str, n: int, k: int, group_size: int = 128, seed: int = 0, sym: bool = False):
    """(QuantizedWeight, tensors on DEVICE, meta) of a random weight [N, K] quantized for ``layout``."""
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    if layout == "w4a8-lqq":
        qw = lqq_quantize(w * 0.05, group_size)
    elif layout == "w8":
        qw = grid.quantize(w, 8, group_size, sym=True)
    else:
        qw = grid.quantize(w, 4, group_size, sym=sym)
    lay = get_layout(layout)
    tensors = {key: t.to(DEVICE) for key, t in lay.pack(qw).items()}
    return qw, tensors, lay.layout_meta(qw)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64 (NaN anywhere counts as infinite error)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def poisoned(m: int, n: int, dtype: torch.dtype) -> torch.Tensor:
    """An output buffer full of NaN: a kernel that skips an element leaves a NaN behind."""
    return torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)


def record_launches(monkeypatch, module, name: str, skip: int, stop: int | None = None) -> list:
    """Replace ``module.name`` (a kernel wrapper) with one that runs it and then records its positional arguments
    ``skip`` to ``stop`` (the launch config): launches that failed to build (and fell back) are not recorded."""
    calls = []
    wrapped = getattr(module, name)

    def spy(*args, **kwargs):
        y = wrapped(*args, **kwargs)
        calls.append(args[skip:stop])
        return y

    monkeypatch.setattr(module, name, spy)
    return calls


def pretend_hopper(monkeypatch, sms: int = 132) -> None:
    """Make the kernel registry see an sm_90 GPU with ``sms`` SMs, CuPy and Gluon (CPU tests of the selection that
    replace the launches with fakes); the plan cache is cleared now and after the test."""
    from quantkit.runtime.kernels import gemm, registry

    monkeypatch.setattr(gemm, "device_traits", lambda device: ((9, 0), sms))
    monkeypatch.setattr(gemm, "toolchains", lambda: frozenset({"cupy", "gluon"}))
    registry._plan.cache_clear()
    gemm.problem_for.cache_clear()


def gluon_lqq(codes: torch.Tensor, scales: torch.Tensor, meta: dict, out_dtype: torch.dtype):
    """Y from the LiquidQuant Gluon entries of the registry's plan for this product (the K-pair launch, then the
    launch rule's launches and their fallbacks), or None where every one declines: the Gluon part of the
    ``a8`` priority list, on its own."""
    from quantkit.runtime.kernels import gemm, registry

    n, k = int(meta["out_features"]), int(meta["in_features"])
    p = gemm.problem_for("a8", ("w4a8-lqq",), codes.shape[0], n, k, -1, out_dtype, codes.device)
    call = gemm.A8Call(codes, scales, -1, [("w4a8-lqq", {}, meta, None)], n, out_dtype)
    for c in registry.plan(p):
        if c.ok and c.kernel.name.startswith("gluon_sm90.lqq") and c.kernel.accepts(p, call, c.config) is None:
            y = c.kernel.launch(p, call, c.config)
            if y is not None:
                return y
    return None


def record_kernel_launches(monkeypatch) -> list:
    """Spy on the ``launch`` of every registered kernel (:data:`quantkit.runtime.kernels.registry.PRIORITY`):
    (kernel name, launch config) of each launch that returned a result, in call order (launches that declined — a
    config that did not build — are not recorded)."""
    from quantkit.runtime.kernels import registry

    calls = []
    seen = set()
    for kernels in registry.PRIORITY.values():
        for k in kernels:
            if id(k) in seen:  # a kernel serving two operations is one instance
                continue
            seen.add(id(k))

            def spy(p, call, cfg, _launch=k.launch, _name=k.name):
                y = _launch(p, call, cfg)
                if y is not None:
                    calls.append((_name, cfg))
                return y

            monkeypatch.setattr(k, "launch", spy)
    return calls


def planned_launch(monkeypatch, op: str, layouts: tuple, m: int, n: int, k: int, act_group: int,
                   dtype: torch.dtype, weight_group: int | None = None) -> tuple:
    """(kernel name, launch config) of the first entry of the registry's plan that can run this product on DEVICE,
    with the tuned launch tables hidden (``QUANTKIT_TUNED_TABLES=0`` for the rest of the test, so the entry points
    see the same plan): the launch the entry point runs first."""
    from quantkit.runtime.kernels import gemm, registry

    monkeypatch.setenv(registry.ENV_TABLES, "0")
    p = gemm.problem_for(op, tuple(layouts), m, n, k, act_group, dtype, torch.device(DEVICE), weight_group)
    first = next(c for c in registry.plan(p) if c.ok)
    return first.kernel.name, first.config


def a8_split(kernel: str, config) -> int | None:
    """The K split at which the Triton int8 kernel gives the same bits as this launch of an ``a8``/``a8_mixed``
    kernel: the launch's own split (the same fp32 partial sums added in the same order), 1 where the split's partial
    sums are exact int32 (the CUDA cluster kernel), None where the kernel sums in another order (the A8 GEMV)."""
    if kernel.startswith("triton."):
        return config.split_k
    if kernel in ("cuda.lqq_cluster", "gluon_sm90.lqq_ws_k_pair"):
        return 1
    if kernel == "gluon_sm90.lqq":  # (bm, stages, split, tail, warpgroups) / (bm, stages, tail, wg, per_sm, split)
        from quantkit.runtime.kernels.gluon_sm90.lqq_wgmma import KERNEL as LQQ_WGMMA

        return config.args[2] if config.kernel == LQQ_WGMMA else config.args[5]
    if kernel in ("gluon_sm90.w8a8", "gluon_sm90.w8a8_mixed"):
        return config[5]
    return None
