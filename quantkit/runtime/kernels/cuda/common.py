"""What the CUDA decode GEMVs (:mod:`quantkit.runtime.kernels.cuda.gemv`, :mod:`quantkit.runtime.kernels.cuda.gemv_a8`)
share: the C++ ``PRELUDE`` (streaming weight loads, the group index of a 128-column half-tile, the cross-warp reduction
that writes a block's outputs, the programmatic-dependent-launch wait and trigger) that each GEMV's source begins with,
and the host side — CuPy detection, NVRTC compilation of one template instance (cached, with a compile failure
reported as a reason so the Triton kernels run instead), the torch stream as a CuPy stream, the launch itself, and the
shift form of a group size.

Programmatic dependent launch (Hopper, sm_90): a GEMV is launched with the driver's programmatic stream
serialization attribute, so it may start while the kernel before it on the stream is still running. Its blocks
load their first one or two weight tiles per warp — which no earlier kernel writes — and only then wait
(``griddepcontrol.wait``: the previous grid complete, its writes visible) before reading activations; each GEMV and
the activation quantizer also signal at their start that the next such kernel may launch. A decode step's weight
stream so overlaps the activation quantizer and the tail of the previous GEMV. The wait always blocks until the
previous grid (whether that one was launched with the attribute or not) has completed; it returns at once only in a
kernel that was itself launched the ordinary way. The wait and trigger exist only in the source compiled with
``QK_PDL``, which refuses to compile below sm_90 (:func:`launch_form`), so an attribute launch never meets code
without its wait. ``QUANTKIT_PDL=0`` launches everything the ordinary way.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
import warnings
from importlib import resources

def cuda_source(*names: str) -> str:
    """The concatenated text of the C++ files ``names`` of this folder (``prelude.cuh`` first where a kernel needs
    it), read with importlib.resources so that an installed wheel finds them; NVRTC compiles the result."""
    folder = resources.files(__package__)
    return "".join(folder.joinpath(n).read_text(encoding="utf-8") for n in names)


PRELUDE = cuda_source("prelude.cuh")  # streaming loads, the epilogue store and the token-column loops


@functools.lru_cache(maxsize=1)
def cupy_available() -> bool:
    """True when CuPy imports and sees a CUDA device (kernels compile on first use)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 — no CuPy, no driver, or no device: the Triton kernels run instead
        return False


ARCH_LINE = re.compile(r"^// quantkit-arch: (sm_\w+)$", re.MULTILINE)  # a source that needs e.g. sm_90a (wgmma)


class _ArchKernel:
    """A kernel compiled for an architecture CuPy's RawModule does not target (``sm_90a``), with the two things
    :func:`launch` uses of a CuPy RawKernel: ``kernel.ptr`` and the call."""

    def __init__(self, function, cubin: bytes):
        self.kernel = function
        self.cubin = cubin  # what ran: the tests scan its SASS (quantkit.bench.sass)

    def __call__(self, grid, block, args, shared_mem: int = 0):
        self.kernel(grid, block, args, shared_mem=shared_mem)


def _cuda_header_dirs(cupy) -> list[str]:
    """Where cuda_fp16.h may be: the CUDA runtime headers as cuda.pathfinder finds them (pip wheels; what CuPy's own
    compiler uses where it has it), then the toolkit of ``cupy.cuda.get_cuda_path()``."""
    dirs = []
    with contextlib.suppress(Exception):  # no cuda.pathfinder (older CuPy), or it fails: the toolkit path below
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            dirs.append(found)
    cuda_path = cupy.cuda.get_cuda_path()
    if cuda_path and os.path.isdir(os.path.join(cuda_path, "include")):
        dirs.append(os.path.join(cuda_path, "include"))
    return dirs


def _compile_for_arch(source: str, name: str, arch: str):
    """NVRTC straight through CuPy's bindings: RawModule adds its own ``-arch=sm_90``, and wgmma needs the
    architecture-specific ``sm_90a`` target."""
    import cupy
    from cupy.cuda import function
    from cupy_backends.cuda.libs import nvrtc

    options = ["--std=c++17", f"-arch={arch}"] + [f"-I{d}" for d in _cuda_header_dirs(cupy)]
    prog = nvrtc.createProgram(source, "quantkit.cu", (), ())
    try:
        nvrtc.addNameExpression(prog, name)
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            raise RuntimeError(f"NVRTC ({arch}): {nvrtc.getProgramLog(prog)[:2000]}") from e
        lowered, cubin = nvrtc.getLoweredName(prog, name), nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)
    mod = function.Module()
    mod.load(cubin)
    return _ArchKernel(mod.get_function(lowered), cubin)


@functools.lru_cache(maxsize=None)
def compiled(device_index: int, source: str, name: str):
    """The CuPy function of template instance ``name`` of ``source`` on that device (NVRTC, ~1 s on first use); a
    source with a ``// quantkit-arch: sm_XX`` line compiles for that architecture (:func:`_compile_for_arch`)."""
    import cupy

    arch = ARCH_LINE.search(source)
    with cupy.cuda.Device(device_index):
        if arch:
            return _compile_for_arch(source, name, arch.group(1))
        mod = cupy.RawModule(code=source, options=("--std=c++17",), name_expressions=[name])
        mod.compile()
        return mod.get_function(name)


def device_problem(a_codes, others: list, capability: tuple[int, int], too_old: str,
                   exact: bool = False) -> str | None:
    """The device checks the CUDA kernels' ``*_problem`` functions share (None: all pass): the activation codes on a
    CUDA device, every tensor of ``others`` on that device, a compute capability of at least ``capability`` (with
    ``exact``: that one; else the reason ``too_old``), and CuPy seeing a GPU."""
    import torch

    if not a_codes.is_cuda:
        return "activations are not on a CUDA device"
    if any(t.device != a_codes.device for t in others):
        return "tensors are not all on the activations' CUDA device"
    have = torch.cuda.get_device_capability(a_codes.device)
    if have < capability or (exact and have != capability):
        return too_old
    if not cupy_available():
        return "CuPy is not installed or sees no GPU"
    return None


def device_index(t) -> int:
    """The CUDA device index of tensor ``t`` (the current device where its device has none)."""
    import torch

    return t.device.index if t.device.index is not None else torch.cuda.current_device()


@functools.lru_cache(maxsize=None)
def compile_problem(device_index: int, source: str, names: tuple[str, ...], what: str) -> str | None:
    """None when every instance in ``names`` compiles (cached) in the form :func:`launch_form` picks, else the
    reason, with a warning that ``what`` falls back to Triton."""
    try:
        for name in names:
            launch_form(device_index, source, name)
    except Exception as e:  # noqa: BLE001 — NVRTC/driver trouble: the Triton kernels run instead
        warnings.warn(f"quantkit {what} unavailable ({type(e).__name__}: {str(e)[:200]}); using Triton",
                      RuntimeWarning, stacklevel=3)
        return f"the {what} did not compile: {type(e).__name__}"
    return None


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=64)
def stream(device_index: int, handle: int):
    """The torch stream ``handle`` as a CuPy stream, so kernels run in order with torch work (and graph capture);
    one wrapper per handle (it owns nothing, and building one costs more than a decode launch)."""
    import cupy

    with warnings.catch_warnings():  # CuPy 14 deprecates ExternalStream for Stream.from_external; both wrap the handle
        warnings.simplefilter("ignore", DeprecationWarning)
        return cupy.cuda.ExternalStream(handle, device_index)


def cxx_bool(value: bool) -> str:
    """A bool as a C++ template argument of a kernel instance name ("true" / "false")."""
    return "true" if value else "false"


def group_shift(group_size: int, halves_per_group: int) -> int:
    """The ``shift`` argument of PRELUDE's group_of: log2 of the group size in half-tiles when it is a power of
    two, 31 for one group per row (every half-tile index >> 31 is 0), else -1 (group_of then divides)."""
    if group_size == -1:
        return 31
    return halves_per_group.bit_length() - 1 if halves_per_group & (halves_per_group - 1) == 0 else -1


PDL_SWITCH = "QUANTKIT_PDL"  # "0": launch the GEMVs without programmatic dependent launch
PDL_DEFINE = "#define QK_PDL 1\n"  # prepended to a GEMV source: the form with griddepcontrol (PRELUDE)
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_REFUSALS = {1: "CUDA_ERROR_INVALID_VALUE", 801: "CUDA_ERROR_NOT_SUPPORTED"}  # the driver will not launch it so
_PDL_OFF: dict[int, str] = {}  # device → why this process launches its GEMVs the ordinary way after all
_PDL_FORM_FAILED: set[int] = set()  # devices where the QK_PDL form did not compile (the plain form runs)


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: id, padding to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_int * 16)]


_PDL_ATTR = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
_PDL_ATTR.value[0] = 1  # programmaticStreamSerializationAllowed; one attribute for every launch


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_bytes", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)),
                ("num_attrs", ctypes.c_uint)]


_CTYPES = {"uint64": ctypes.c_uint64, "int64": ctypes.c_int64, "int32": ctypes.c_int32, "uint32": ctypes.c_uint32}


@functools.lru_cache(maxsize=1)
def _ctype_of_scalar() -> dict[type, type]:
    import numpy as np

    return {np.dtype(name).type: ct for name, ct in _CTYPES.items()}


def kernel_params(args: tuple) -> tuple[ctypes.Array, list]:
    """The ``void**`` kernel-parameter array of ``args`` (NumPy scalars as the CuPy launch takes them) and the
    ctypes values it points to (keep them alive until the launch returns). On the decode hot path: one dict lookup
    per argument (a NumPy dtype's ``.name`` costs more than the launch)."""
    ctype_of = _ctype_of_scalar()
    values = []
    for a in args:
        ct = ctype_of.get(type(a))
        if ct is None:
            raise TypeError(f"kernel argument {a!r} is not a NumPy uint64/int64/int32/uint32 scalar")
        values.append(ct(int(a)))
    params = (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))
    return params, values


@functools.lru_cache(maxsize=1)
def _cu_launch_kernel_ex():
    lib = ctypes.CDLL("libcuda.so.1")
    fn = lib.cuLaunchKernelEx
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return fn


@functools.lru_cache(maxsize=None)
def _pdl_device(device_index: int) -> bool:
    import torch

    if torch.cuda.get_device_capability(device_index) < (9, 0):
        return False
    try:
        _cu_launch_kernel_ex()
    except (OSError, AttributeError):
        return False
    return True


def pdl_supported(device_index: int) -> bool:
    """True when the GEMVs on this device launch with programmatic dependent launch: ``QUANTKIT_PDL`` is not "0",
    compute capability >= 9.0, the driver has ``cuLaunchKernelEx``, and neither NVRTC nor the driver refused it
    earlier in this process (:func:`pdl_off_reason`)."""
    return os.environ.get(PDL_SWITCH, "1") != "0" and device_index not in _PDL_OFF and _pdl_device(device_index)


def pdl_off_reason(device_index: int) -> str | None:
    """Why this process stopped launching the GEMVs on that device with programmatic dependent launch, if it did."""
    return _PDL_OFF.get(device_index)


def _turn_pdl_off(device_index: int, why: str) -> None:
    _PDL_OFF[device_index] = why
    warnings.warn(f"quantkit: programmatic dependent launch off on cuda:{device_index} ({why}); launching the "
                  "GEMVs the ordinary way", RuntimeWarning, stacklevel=3)


@functools.lru_cache(maxsize=None)
def _pdl_source(source: str) -> str:
    # one string object per source: building (and hashing) a new one for every launch's compiled() lookup would
    # put ~20 KB of string work on the decode hot path
    return PDL_DEFINE + source


def launch_form(device_index: int, source: str, name: str) -> tuple[object, bool]:
    """(CuPy function of instance ``name``, whether to launch it with programmatic dependent launch now).

    On a device that can take the attribute launch (compute capability >= 9.0, ``cuLaunchKernelEx``) and unless
    ``QUANTKIT_PDL=0``, the ``QK_PDL`` form of ``source`` — it refuses to compile below sm_90, so an attribute launch
    always meets its wait. It stays the form after the driver refused the attribute (then launched the ordinary
    way, which is safe: its wait returns at once), so no second compile lands on the hot path or in a CUDA-graph
    capture. If the ``QK_PDL`` form does not compile but the plain one does, PDL is off for the device from then
    on; if neither compiles, the plain form's error is raised (the caller's Triton fallback handles it)."""
    if os.environ.get(PDL_SWITCH, "1") != "0" and device_index not in _PDL_FORM_FAILED and _pdl_device(device_index):
        try:
            return compiled(device_index, _pdl_source(source), name), pdl_supported(device_index)
        except Exception as e:  # noqa: BLE001 — e.g. an NVRTC too old for sm_90: the plain form may still build
            plain = compiled(device_index, source, name)
            _PDL_FORM_FAILED.add(device_index)
            _turn_pdl_off(device_index, f"the griddepcontrol form did not compile: {type(e).__name__}")
            return plain, False
    return compiled(device_index, source, name), False


_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CUfunction_attribute CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_SHARED_OPT_IN: set[tuple[int, int, int]] = set()  # (device, CUfunction, bytes) already allowed


def allow_dynamic_shared(fn, device_index: int, nbytes: int) -> None:
    """Let CuPy function ``fn`` launch with ``nbytes`` of dynamic shared memory on that device (above 48 KiB a
    kernel must opt in, ``cuFuncSetAttribute``); once per function and size. RuntimeError if the driver refuses
    (more than the device allows a block)."""
    key = (device_index, int(fn.kernel.ptr), nbytes)
    if nbytes <= 48 * 1024 or key in _SHARED_OPT_IN:
        return
    import cupy

    with cupy.cuda.Device(device_index):
        lib = ctypes.CDLL("libcuda.so.1")
        err = lib.cuFuncSetAttribute(ctypes.c_void_p(int(fn.kernel.ptr)), _MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                     ctypes.c_int(nbytes))
    if err != 0:
        raise RuntimeError(f"cuFuncSetAttribute(max dynamic shared memory = {nbytes}) failed with CUresult {err}")
    _SHARED_OPT_IN.add(key)


def launch(fn, pdl: bool, device_index: int, stream_handle: int, grid: tuple, block: tuple, args: tuple,
           shared_mem: int = 0) -> None:
    """Launch CuPy function ``fn`` (from :func:`launch_form`) on the torch stream ``stream_handle`` with
    ``shared_mem`` bytes of dynamic shared memory (above 48 KiB see :func:`allow_dynamic_shared`) — with
    programmatic dependent launch when ``pdl`` and :func:`pdl_supported` still holds (module docstring), else as
    CuPy launches it. When the driver refuses the attribute (invalid value / not supported) and the same kernel
    then launches the ordinary way, PDL is off for this device in this process, with a warning; any other driver
    error of the attribute launch is raised, as is any error of the ordinary one."""
    import cupy

    g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
    if pdl and pdl_supported(device_index) and min(g) > 0 and min(b) > 0:
        cfg = _LaunchConfig((ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), shared_mem, stream_handle,
                            ctypes.pointer(_PDL_ATTR), 1)
        params, _values = kernel_params(args)
        with cupy.cuda.Device(device_index):  # the stream travels in cfg
            err = _cu_launch_kernel_ex()(ctypes.byref(cfg), fn.kernel.ptr, params, None)  # CUfunction
        if err == 0:
            return
        if err not in _REFUSALS:
            raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {err}")
        with cupy.cuda.Device(device_index), stream(device_index, stream_handle):
            fn(grid, block, args, shared_mem=shared_mem)  # raises if the arguments, not the attribute, were the trouble
        _turn_pdl_off(device_index, f"the driver refused the launch attribute: {_REFUSALS[err]}")
        return
    with cupy.cuda.Device(device_index), stream(device_index, stream_handle):
        # an ordinary launch runs after the previous kernel anyway: the QK_PDL form's wait returns at once, and a
        # PDL-launched kernel after it waits for it to complete, so either form may run here
        fn(grid, block, args, shared_mem=shared_mem)


class BoundLaunch:
    """One kernel launch prepared for repeated calls that change only some pointer arguments (a layer's decode GEMV
    at one token count: new activation and output pointers each step, everything else fixed): the grid, the block,
    the ``void**`` parameter array and the launch config are built once, so a call writes the new pointers in place
    and makes one ``cuLaunchKernelEx`` call on the current torch stream. Programmatic dependent launch as
    :func:`launch` decides it. :meth:`create` returns None where the driver has no ``cuLaunchKernelEx``
    (:func:`launch` then serves)."""

    def __init__(self, fn, pdl: bool, device_index: int, grid: tuple, block: tuple, args: tuple,
                 pointer_args: tuple[int, ...], shared_mem: int = 0):
        g, b = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        self.device_index = device_index
        self.params, values = kernel_params(args)
        self.values = values
        self.pointers = [values[i] for i in pointer_args]
        use_pdl = pdl and pdl_supported(device_index)
        self.config = _LaunchConfig((ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), shared_mem, None,
                                    ctypes.pointer(_PDL_ATTR) if use_pdl else None, 1 if use_pdl else 0)
        self.config_ref = ctypes.byref(self.config)
        self.function = ctypes.c_void_p(int(fn.kernel.ptr))
        self.launch_ex = _cu_launch_kernel_ex()
        self.lock = threading.Lock()  # one parameter array: two threads must not interleave its writes and launch

    @classmethod
    def create(cls, fn, pdl: bool, device_index: int, grid: tuple, block: tuple, args: tuple,
               pointer_args: tuple[int, ...], shared_mem: int = 0) -> BoundLaunch | None:
        """A :class:`BoundLaunch` whose arguments at positions ``pointer_args`` change per call, or None where it
        cannot be made (no ``cuLaunchKernelEx``, an empty grid)."""
        if min(grid) <= 0:
            return None
        try:
            return cls(fn, pdl, device_index, grid, block, args, pointer_args, shared_mem)
        except (OSError, AttributeError):
            return None

    def __call__(self, *pointers: int) -> bool:
        """Launch with these values of the pointer arguments; True when the driver took it. False (another current
        device, or the driver refused): the caller launches through :func:`launch`, which handles a refused
        attribute."""
        import torch

        dev = self.device_index
        if torch.cuda.current_device() != dev:
            return False
        with self.lock:
            for value, ptr in zip(self.pointers, pointers):
                value.value = ptr
            self.config.stream = torch._C._cuda_getCurrentRawStream(dev)
            return self.launch_ex(self.config_ref, self.function, self.params, None) == 0
