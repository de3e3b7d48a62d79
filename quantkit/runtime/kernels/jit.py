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

import inspect
import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402  (after the interpreter switch above)
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from quantkit.runtime.kernels.scratch import graph_scratch_active  # noqa: E402

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


FAST_LAUNCH_MIN_TRITON = (3, 3)  # from 3.3 a compiled kernel's launcher takes every bound argument, constexprs too
_FAST_LAUNCH = not INTERPRET and tuple(int(p) for p in triton.__version__.split(".")[:2]) >= FAST_LAUNCH_MIN_TRITON
_LAUNCHERS: dict[tuple, object] = {}
_MAX_LAUNCHERS = 4096
_NOT_FAST = object()


def specialization_key(fn, grid: tuple, args: tuple, kwargs: dict, device: int) -> tuple:
    """What Triton's compiled-kernel choice depends on in a launch on CUDA device ``device``, or more: tensors by
    dtype and 16-byte alignment, every other argument by type and value, the keyword arguments (constexprs and
    launch options), the grid and the device."""
    key = [fn, grid, device]
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((a.dtype, a.data_ptr() % 16 == 0))
        else:
            key.append((type(a), a))
    key.append(tuple(kwargs.items()))
    return tuple(key)


def _compiled_runner(fn, grid: tuple, args: tuple, kwargs: dict):
    """(the compiled kernel's launcher for ``grid``, the constexpr arguments after ``args`` in parameter order) for
    a launch like this one, compiled by Triton's own path (``warmup``); :data:`_NOT_FAST` where this function is
    not a plain JIT function."""
    if not isinstance(fn, JITFunction):
        return _NOT_FAST
    compiled = fn.warmup(*args, grid=grid, **kwargs)
    if compiled is None:
        return _NOT_FAST
    params = list(inspect.signature(fn.fn).parameters.values())[len(args):]
    tail = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in params)
    return compiled[tuple(grid) + (1,) * (3 - len(grid))], tail  # the launcher reads all three grid dimensions


def launch_kernel(fn, grid: tuple, *args, **kwargs) -> None:
    """``fn[grid](*args, **kwargs)`` without Triton's per-call argument binding and specialization where that was
    done once already for a launch with the same :func:`specialization_key` (the compiled kernel's launcher is
    kept and called with these arguments): decode sizes launch a few hundred small kernels per token, each paying
    that host work (0-25 µs a launch on Triton 3.6, measured on an H200 host; :class:`PreparedLaunch` removes the
    rest). The interpreter, Triton before 3.3 and anything other than a plain JIT function take Triton's own
    path."""
    entry = _launcher(fn, grid, args, kwargs) if _FAST_LAUNCH else _NOT_FAST
    if entry is _NOT_FAST:
        fn[grid](*args, **kwargs)
        return
    runner, tail = entry
    runner(*args, *tail)


def _launcher(fn, grid: tuple, args: tuple, kwargs: dict):
    """The cached (launcher, constexpr tail) of a launch like this one (:func:`_compiled_runner`)."""
    key = specialization_key(fn, grid, args, kwargs, torch.cuda.current_device())
    entry = _LAUNCHERS.get(key)
    if entry is None:
        if len(_LAUNCHERS) >= _MAX_LAUNCHERS:  # many distinct token counts: start over rather than grow
            _LAUNCHERS.clear()
        entry = _LAUNCHERS[key] = _compiled_runner(fn, grid, args, kwargs)
    return entry


def in_graph() -> bool:
    """Whether launches are being captured into a CUDA graph, or run where a graph owns the split-K scratch
    (:func:`.scratch.graph_owned_scratch`): a prepared launch holds eager scratch, which a graph must not keep."""
    return graph_scratch_active() or (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


class PreparedLaunch:
    """One Triton launch prepared for repeated calls that differ only in the tensors at positions ``slots`` of its
    arguments (a layer's activations and output): the compiled launcher, the argument list and the stream are
    fixed, so a call checks the new tensors' alignment and stream and launches. Made by :meth:`create`; the first
    call's tensors at ``slots`` are not kept."""

    def __init__(self, runner, args: list, slots: tuple[int, ...], aligned: tuple[bool, ...], device: int,
                 stream: int):
        self.runner, self.args, self.slots, self.aligned = runner, args, slots, aligned
        self.device, self.stream = device, stream

    @classmethod
    def create(cls, fn, grid: tuple, args: tuple, kwargs: dict, slots: tuple[int, ...]) -> PreparedLaunch | None:
        """The launch ``fn[grid](*args, **kwargs)`` prepared (the kernel compiled if it was not), or None where
        launches cannot be prepared (the interpreter, Triton before 3.3, not a plain JIT function)."""
        if not _FAST_LAUNCH or in_graph():
            return None
        entry = _launcher(fn, grid, args, kwargs)
        if entry is _NOT_FAST:
            return None
        runner, tail = entry
        full = list(args) + list(tail)
        aligned = tuple(full[i].data_ptr() % 16 == 0 for i in slots)
        for i in slots:
            full[i] = None
        device = torch.cuda.current_device()
        return cls(runner, full, tuple(slots), aligned, device, torch.cuda.current_stream(device).cuda_stream)

    def __call__(self, *tensors: torch.Tensor) -> bool:
        """Launch with ``tensors`` at the slots; False (nothing launched) when one is not 16-byte aligned where the
        prepared kernel assumes it, the current device or stream is not the one prepared for (its split-K
        workspace), or a CUDA graph is being captured."""
        for t, aligned in zip(tensors, self.aligned):
            if aligned and t.data_ptr() % 16:
                return False
        if (torch.cuda.current_device() != self.device
                or torch._C._cuda_getCurrentRawStream(self.device) != self.stream or in_graph()):
            return False
        args = self.args.copy()
        for i, t in zip(self.slots, tensors):
            args[i] = t
        self.runner(*args, stream=self.stream)
        return True


class PreparedByShape:
    """Prepared launches of one entry point by call shape (the caller's key: everything its launch arguments depend
    on besides the slot tensors), with a value the caller needs alongside (e.g. its group count); at most ``limit``
    shapes, then it starts over (many prompt lengths)."""

    def __init__(self, limit: int = 1024):
        self.limit = limit
        self._entries: dict[tuple, tuple[PreparedLaunch | None, object]] = {}

    def get(self, key: tuple) -> tuple[PreparedLaunch | None, object]:
        """(the prepared launch or None, the value kept with it) of a call shape, (None, None) when unknown."""
        return self._entries.get(key, (None, None))

    def __contains__(self, key: tuple) -> bool:
        return key in self._entries

    def remember(self, key: tuple, prepare, value: object = None) -> None:
        """Prepare this call shape's launch (``prepare()`` → PreparedLaunch | None) once: kept — or that it has
        none — unless a CUDA graph being captured kept it from being prepared (an eager call prepares it later)."""
        if key in self._entries:
            return
        prepared = prepare()
        if prepared is None and in_graph():
            return
        if len(self._entries) >= self.limit:
            self._entries.clear()
        self._entries[key] = (prepared, value)

    def clear(self) -> None:
        self._entries.clear()

    def values(self):
        return self._entries.values()

