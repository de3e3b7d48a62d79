"""How quantkit's Triton kernels are compiled: JIT for a CUDA device, Triton's CPU interpreter otherwise.

Triton decides between the two when a function is decorated, from ``TRITON_INTERPRET`` — including its own
standard library (``tl.zeros``, ``tl.max`` …), decorated when triton is first imported. So on a machine without
a CUDA device this module sets ``TRITON_INTERPRET=1`` (unless the user set it) *before* importing triton; the
kernels then run on CPU tensors, which is how CI tests them. If triton was already imported without it, the
interpreter cannot call the JIT-compiled standard library: :func:`check_device` says so.

Inline PTX has no interpreter, so each kernel has a plain-Triton path with the same arithmetic (``USE_ASM``
False) that the interpreter runs and the GPU tests compare bit-exactly against the PTX path.
"""

from __future__ import annotations

import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (after the interpreter switch above)
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
USE_ASM = not INTERPRET
_STDLIB_COMPILED = isinstance(tl.zeros, JITFunction)


def kernel(fn):
    """``triton.jit``: compiled for CUDA, or interpreted under ``TRITON_INTERPRET=1`` (module docstring)."""
    return triton.jit(fn)


def check_device(*tensors: torch.Tensor) -> None:
    """Refuse to launch on tensors the compiled kernels cannot read: CUDA kernels need CUDA tensors, the
    interpreter CPU tensors (a mismatch is a programming error, not a user mistake)."""
    if INTERPRET and _STDLIB_COMPILED:
        raise RuntimeError("triton was imported before quantkit could select its CPU interpreter; set "
                           "TRITON_INTERPRET=1 before importing triton to run the kernels on CPU tensors")
    want = "cpu" if INTERPRET else "cuda"
    bad = [t.device.type for t in tensors if t.device.type != want]
    if bad:
        raise ValueError(f"Triton kernels compiled for '{want}' got tensors on {sorted(set(bad))}")
