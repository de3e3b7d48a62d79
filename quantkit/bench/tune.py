"""``quantkit tune``: time every kernel and launch config that can run each (method, N, K, M) on the GPU at hand,
and write the fastest to the launch tables the registry reads (:mod:`quantkit.runtime.kernels.tables`).

For each point the candidates are, over the op's priority list, every kernel that can implement the problem
(whether or not its launch rule picks it there) with each config of :meth:`~quantkit.runtime.kernels.registry.
GemmKernel.candidates`. Each candidate's output on the point's first input is first checked against the torch
reference of the packed format (:mod:`quantkit.runtime.kernels.reference`): relative error at most
:data:`MAX_REL_ERR` (a K split changes only the fp32 summation order), and whether it equals the default choice's
output bit for bit is recorded. Only checked candidates are timed (CUDA graphs of rotating inputs, the bench's
timing): a short screening timing each, then the :data:`FINALISTS` fastest with the default choice (the priority
list alone), each after the GPU is warm, in two rounds of opposite order; each keeps its smaller median, and every
entry states what tuning gained over the default.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from quantkit.bench.explain import METHOD_PROBLEMS, PER_CHANNEL_METHODS
from quantkit.errors import QuantkitError

MAX_REL_ERR = {"a8": 1e-3, "a8_mixed": 1e-3, "a16": 1e-2}  # fp16 outputs of fp16 products (a16) round coarser


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; infinite where out is not finite."""
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def reference_output(method: str, inputs: tuple, meta: dict) -> torch.Tensor:
    """The torch reference's Y for one input tuple of a bench problem of ``method`` whose packed weight has
    ``meta`` (for ``mixed``, the layer's out_features; each partition carries its own)."""
    from quantkit.runtime.kernels.reference import int8_reference, w4a16_reference

    if method == "w4a16":
        x, tensors = inputs
        return w4a16_reference(x, tensors, meta)
    a, s, packed = inputs
    op, layouts, act = METHOD_PROBLEMS[method]
    if op == "a8_mixed":
        out = torch.empty(a.shape[0], meta["out_features"], dtype=torch.float32, device=a.device)
        for layout, tensors, pmeta, rows in packed:
            out[:, rows.long()] = int8_reference(a, s, act, layout, tensors, pmeta).float()
        return out
    return int8_reference(a, s, act, layouts[0], packed, meta)


WARM_MS = 25.0  # GPU work before each timing: clocks drop while the host compiles, and ramp back within this
SCREEN_REPS = 5  # graph replays of the screening timing
FINALISTS = 4  # candidates the screening passes on to the two-round timing


def warm_time(fn: Callable, inputs: Sequence[tuple], reps: int) -> float:
    """Median µs of one ``fn(*inputs[i])`` (:func:`quantkit.bench.timing.time_rotating`, CUDA graphs) after
    :data:`WARM_MS` of back-to-back calls."""
    from quantkit.bench.timing import time_rotating

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    i = 0
    while True:
        for _ in range(8):
            fn(*inputs[i % len(inputs)])
            i += 1
        end.record()
        end.synchronize()
        if start.elapsed_time(end) >= WARM_MS:
            break
    return time_rotating(fn, inputs, reps=reps)["ms"] * 1e3


def tune_candidates(p) -> list[tuple[str, object]]:
    """(kernel name, config) of every kernel of ``p``'s priority list that can implement ``p``, each config of
    its tune space (module docstring)."""
    from quantkit.runtime.kernels.registry import PRIORITY

    out = []
    for k in PRIORITY[p.op]:
        ok, _ = k.can_implement(p)
        if ok:
            out.extend((k.name, cfg) for cfg in k.candidates(p))
    return out


def tune_point(method: str, m: int, n: int, k: int, reps: int = 30,
               timer: Callable | None = None) -> dict:
    """One entry: the fastest checked (kernel, config) for ``method`` at M × N × K on this GPU, with the default
    choice's kernel and time, and every candidate's result (``tried``)."""
    from quantkit.bench.problems import build_problem
    from quantkit.runtime.kernels import gemm
    from quantkit.runtime.kernels.registry import kernel_named, plan

    timer = timer or (lambda fn, inputs: warm_time(fn, inputs, reps))
    with tables_hidden():
        return _tune_point(method, m, n, k, timer, build_problem, gemm, kernel_named, plan)


@contextlib.contextmanager
def tables_hidden():
    """The registry without tuned tables for the duration: the default a tune run times is the priority list's own
    choice, not an entry this same run wrote for a neighbouring M."""
    from quantkit.runtime.kernels.registry import ENV_TABLES

    saved = os.environ.get(ENV_TABLES)
    os.environ[ENV_TABLES] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(ENV_TABLES, None)
        else:
            os.environ[ENV_TABLES] = saved


def _tune_point(method, m, n, k, timer, build_problem, gemm, kernel_named, plan) -> dict:
    op, layouts, act = METHOD_PROBLEMS[method]
    prob = build_problem(method, m, n, k)
    x0 = prob.inputs[0]
    p = gemm.problem_for(op, layouts, m, n, k, act, torch.float16, x0[0].device,
                         -1 if method in PER_CHANNEL_METHODS else None)
    ref = reference_output(method, x0, prob.state["meta"])
    default = next(c for c in plan(p) if c.ok)  # what the priority list alone runs first
    default_y = prob.fn(*x0).clone()
    tried, checked = [], []
    for name, cfg in tune_candidates(p):
        prob.state.update(kernel=name, launch_config=cfg)
        row = {"kernel": name, "config": kernel_named(name).config_to_json(cfg)}
        try:
            y = prob.fn(*x0)
            torch.cuda.synchronize()
            err = rel_err(y, ref)
            row.update(rel_err=err, bits_equal_default=bool(torch.equal(y, default_y)))
            if err <= MAX_REL_ERR[op]:
                checked.append((row, name, cfg))
        except Exception as e:  # noqa: BLE001 — a launch that does not build here is a result of the sweep
            lines = str(e).strip().splitlines()
            row["error"] = f"{type(e).__name__}: {(lines[0] if lines else '')[:200]}"
        tried.append(row)
    from quantkit.bench.timing import time_rotating

    for row, name, cfg in checked:
        prob.state.update(kernel=name, launch_config=cfg)
        row["screen_us"] = round(time_rotating(prob.fn, prob.inputs, reps=SCREEN_REPS)["ms"] * 1e3, 3)
    finalists = sorted(checked, key=lambda c: c[0]["screen_us"])[:FINALISTS]
    # the finalists and the default, timed in two rounds, the second in reverse order (ABBA), each after the GPU is
    # warm: the smaller median counts, so clock ramps and drift do not favour a position
    runs = [(None, None, None)] + finalists
    times: dict[int, list[float]] = {i: [] for i in range(len(runs))}
    for order in (range(len(runs)), reversed(range(len(runs)))):
        for i in order:
            _, name, cfg = runs[i]
            prob.state.update(kernel=name, launch_config=cfg)
            times[i].append(timer(prob.fn, prob.inputs))
    prob.state.update(kernel=None, launch_config=None)
    default_us = min(times[0])
    for i, (row, _, _) in enumerate(runs[1:], start=1):
        row["us"] = min(times[i])
    timed = [r for r in tried if "us" in r]
    if not timed:
        raise QuantkitError(f"no kernel ran {method} at M={m} N={n} K={k} within the reference's tolerance")
    best = min(timed, key=lambda r: r["us"])
    return {"n": n, "k": k, "m": m, "method": method, "kernel": best["kernel"], "config": best["config"],
            "us": round(best["us"], 3), "bits_equal_default": best["bits_equal_default"],
            "default_kernel": default.kernel.name, "default_us": round(default_us, 3),
            "tried": [{**r, **({"us": round(r["us"], 3)} if "us" in r else {})} for r in tried]}


def _commit() -> str:
    """The source's commit for the table's record: ``$QUANTKIT_COMMIT`` (a copy of the tree without its git
    history), else git's, else the package version."""
    if os.environ.get("QUANTKIT_COMMIT"):
        return os.environ["QUANTKIT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        from quantkit import __version__

        return f"quantkit {__version__}"


def require_gpu() -> None:
    """A one-line QuantkitError where no CUDA GPU is visible."""
    if not torch.cuda.is_available():
        raise QuantkitError("quantkit tune times kernels on a CUDA GPU (none is visible); run it on the GPU to tune")


def run_tune(shapes: Sequence[tuple[int, int]], ms: Sequence[int], methods: Sequence[str], out_dir: Path,
             command: str, reps: int = 30, progress: Callable[[int, int], None] | None = None) -> tuple[list, list]:
    """Tune every (method, shape, M) and write one table per (device, method's op and layouts) under
    ``out_dir``; returns (entries, written paths)."""
    from quantkit.runtime.kernels.registry import device_traits
    from quantkit.runtime.kernels.tables import write_table

    require_gpu()
    tunable = [x for x in METHOD_PROBLEMS if METHOD_PROBLEMS[x][0] != "fp8"]  # cuBLAS's FP8 GEMM has no launches
    wanted = [x for x in methods if x in tunable]
    if not wanted:
        raise QuantkitError(f"quantkit tune tunes the quantkit kernels: --methods from {', '.join(tunable)}")
    dev = torch.device("cuda", torch.cuda.current_device())
    cap, sms = device_traits(dev)
    name = torch.cuda.get_device_name(dev)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit = _commit()
    entries, paths, total, done = [], [], len(wanted) * len(shapes) * len(ms), 0
    for method in wanted:
        op, layouts, act = METHOD_PROBLEMS[method]
        for n, k in shapes:
            for m in ms:
                row = tune_point(method, m, n, k, reps)
                entries.append(row)
                # written point by point, so a run cut short keeps what it measured
                try:
                    path = write_table(out_dir, name, cap, sms, op, layouts, act,
                                       [{kk: v for kk, v in row.items() if kk not in ("method", "tried")}], command,
                                       commit, date)
                except OSError as e:
                    raise QuantkitError(f"cannot write the launch table under {out_dir} ({e.strerror or e}); give a "
                                        "writable folder with -o") from None
                done += 1
                if progress:
                    progress(done, total)
        paths.append(path)
    return entries, paths
