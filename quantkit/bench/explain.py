"""``quantkit bench --explain``: which kernel runs each benchmark point, with its launch config, and why every
kernel ahead of it in the priority list declined (:mod:`quantkit.runtime.kernels.registry`). Nothing is launched,
so it also runs without a GPU for a named one (``--assume-gpu 9.0:132``)."""

from __future__ import annotations

import torch

from quantkit.errors import QuantkitError

# bench method → (registry op, weight layouts, activation group)
METHOD_PROBLEMS = {
    "w4a16": ("a16", ("w4a16",), 0),
    "w8a8": ("a8", ("w8",), 128),
    "w8a8-ch": ("a8", ("w8",), -1),
    "fp8-w8a8": ("fp8", ("fp8",), -1),
    "w4a8": ("a8", ("w4a16",), 128),
    "w4a8-lqq": ("a8", ("w4a8-lqq",), -1),
    "mixed": ("a8_mixed", ("w4a16", "w8"), 128),
    "mixed-lqq": ("a8_mixed", ("w4a8-lqq", "w8"), -1),
}
PER_CHANNEL_METHODS = {"w8a8-ch", "w4a8-lqq", "mixed-lqq"}  # one float scale per weight row (GemmProblem.weight_group)


def parse_gpu(text: str) -> tuple[tuple[int, int], int]:
    """(capability, SM count) of an ``--assume-gpu MAJOR.MINOR:SMS`` value such as ``9.0:132``, or a one-line
    QuantkitError."""
    try:
        cap, sms = text.split(":")
        major, minor = (int(v) for v in cap.split("."))
        sms = int(sms)
    except ValueError:
        raise QuantkitError(f"--assume-gpu takes MAJOR.MINOR:SMS, e.g. 9.0:132 for an H100, got '{text}'") from None
    if sms < 1 or major < 1:
        raise QuantkitError(f"--assume-gpu takes MAJOR.MINOR:SMS with SMS ≥ 1, got '{text}'")
    return (major, minor), sms


def device_gpu(assume: str | None) -> tuple[tuple[int, int], int, frozenset[str], str]:
    """(capability, SMs, toolchains, name) to explain for: ``--assume-gpu`` when given (with CuPy and Gluon
    installed), else the current CUDA device and the toolchains installed here, else "no GPU" (where only the
    Triton kernels, interpreted, can run)."""
    from quantkit.runtime.kernels.gemm import toolchains

    if assume is not None:
        cap, sms = parse_gpu(assume)
        return cap, sms, frozenset({"cupy", "gluon"}), f"an assumed sm_{cap[0]}{cap[1]} GPU with {sms} SMs"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return (props.major, props.minor), props.multi_processor_count, toolchains(), props.name
    return (0, 0), 0, toolchains(), "no GPU"


def explain_rows(shapes: list[tuple[int, int]], ms: list[int], methods: list[str], capability: tuple[int, int],
                 sms: int, toolchains: frozenset[str], device: str = "") -> list[dict]:
    """One row per (shape, M, method) with a quantkit kernel: the chosen kernel and config, and the kernels ahead
    of it with the reason each declined (fp16 activations for ``w4a16``, fp16 output for the int8 methods);
    ``device`` names the GPU whose tuned tables apply ("" for none)."""
    import quantkit.runtime.kernels.gemm  # noqa: F401  (registers the kernels)
    from quantkit.runtime.kernels.registry import GemmProblem, explain

    rows = []
    for n, k in shapes:
        for m in ms:
            for method in methods:
                if method.split("+")[0] not in METHOD_PROBLEMS:
                    continue
                base = method.split("+")[0]
                op, layouts, act = METHOD_PROBLEMS[base]
                p = GemmProblem(op, layouts, m, n, k, act, torch.float16, capability, sms, toolchains, device,
                                -1 if base in PER_CHANNEL_METHODS else None)
                entries = explain(p)
                chosen = entries[-1]
                rows.append({"shape": f"{n}x{k}", "m": m, "method": method, "kernel": chosen[0],
                             "config": chosen[2], "declined": [{"kernel": e[0], "reason": e[2]} for e in entries[:-1]]})
    if not rows:
        raise QuantkitError(f"--explain covers the quantkit kernels: give --methods with {', '.join(METHOD_PROBLEMS)}")
    return rows


def explain_table(rows: list[dict], title: str):
    """A rich table of :func:`explain_rows`."""
    from rich.table import Table

    table = Table(title=title, show_lines=True)
    for col in ("shape", "M", "method", "kernel", "launch config"):
        table.add_column(col, overflow="fold", no_wrap=col != "launch config")
    table.add_column("declined ahead of it", overflow="fold", ratio=1)
    for r in rows:
        declined = "\n".join(f"{d['kernel']}: {d['reason']}" for d in r["declined"])
        table.add_row(r["shape"], str(r["m"]), r["method"], r["kernel"], r["config"], declined)
    return table
