"""Kernel benchmarks: CUDA-event timing with rotating inputs and CUDA graphs (:mod:`.timing`), ceilings measured
on the device and roofline rows (:mod:`.roofline`), benchmark problems per method (:mod:`.problems`),
``run_bench`` (:mod:`.runner`), launch tuning (:mod:`.tune`), ``python -m quantkit.bench``; and
a check of the Gluon kernels' SASS that needs no GPU (:mod:`.sass`, ``python -m quantkit.bench.sass``).

Submodules are imported on use: the problems need Triton and a GPU, ``import quantkit.bench`` does not."""


def run_bench(shapes, ms, methods, **kwargs):
    """:func:`quantkit.bench.runner.run_bench` (imported on first call)."""
    from quantkit.bench.runner import run_bench as _run

    return _run(shapes, ms, methods, **kwargs)
