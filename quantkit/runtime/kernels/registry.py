"""The kernel registry: which kernel runs a product, decided in one place and explainable.

A product Y [M, N] = X [M, K] · Ŵᵀ is described by a :class:`GemmProblem` (operation, weight layouts, M, N, K,
activation groups, dtypes, the device's compute capability and its real SM count). Each kernel is a small
:class:`GemmKernel` subclass that answers :meth:`~GemmKernel.can_implement` with ``(ok, reason)`` from the problem
alone (its hard requirements and its launch rule, which gives the launch configs it would use), checks the call's
tensors in :meth:`~GemmKernel.accepts` (alignment, a kernel that failed to build here) and runs in
:meth:`~GemmKernel.launch`. One priority list per operation (:data:`PRIORITY`, filled by :mod:`.gemm`) orders
the kernels; the first one that can implement the problem and accepts the call runs it — vLLM's
``kernels/mixed_precision`` rule (``choose_mp_linear_kernel``), applied per problem rather than per layer because
the best kernel here changes with the token count M.

The problem-level part of the choice (which kernels and configs, in order) is cached per problem, so a call costs a
lookup plus the chosen kernel's tensor checks; :func:`bind` goes one step further for a layer that repeats a call
(eager decoding): the chosen kernel's launch prepared once, where the kernel has such a form. :func:`explain` lists, for a problem, every kernel in priority order
with its config or the reason it declined (``quantkit bench --explain``).

An override names one kernel: the ``kernel=`` argument of the entry points in :mod:`.gemm`, or the environment
variable ``QUANTKIT_KERNEL`` (read per call; it applies to the operations that kernel serves). A forced kernel that
cannot implement the problem is an error naming its reason, never a silent fallback.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from quantkit.errors import QuantkitError

ENV_KERNEL = "QUANTKIT_KERNEL"  # names one registered kernel to run wherever it serves the operation (tests, benches)
ENV_TABLES = "QUANTKIT_TUNED_TABLES"  # "0": ignore the tuned launch tables (the launch rules alone decide)
# the operations: int8 activations × a packed weight; the same for a two-partition layer; fp16/bf16 activations × a
# w4a16 weight; per-token FP8 activations × an fp8 weight
OPS = ("a8", "a8_mixed", "a16", "fp8")


@dataclass(frozen=True)
class GemmProblem:
    """One product as the kernels see it: ``op`` (:data:`OPS`), the weight ``layouts`` (two for ``a8_mixed``), the
    token count ``m``, output features ``n`` (the whole layer's for a mixed one), input features ``k``,
    ``act_group`` (activation group size, -1 per token, 0 for ``a16``), ``dtype`` (the activation dtype of ``a16``
    or the output dtype of the int8 ops), the device's ``capability`` and ``sms`` ((0, 0) and 0 off a GPU), and the
    optional ``toolchains`` installed (CuPy's NVRTC for the CUDA kernels, Triton's Gluon for the Hopper ones), the
    ``device`` name whose tuned tables apply, and ``weight_group``: the columns each float scale of the weight's int8
    operand covers (-1 one per row: per-channel W8, LiquidQuant; None not known, or partitions that differ)."""

    op: str
    layouts: tuple[str, ...]
    m: int
    n: int
    k: int
    act_group: int
    dtype: torch.dtype
    capability: tuple[int, int] = (0, 0)
    sms: int = 0
    toolchains: frozenset[str] = frozenset()  # optional compilers present: "cupy" (NVRTC), "gluon"
    device: str = ""  # the GPU's name, which selects the tuned launch tables (quantkit.runtime.kernels.tables)
    weight_group: int | None = None

    @property
    def per_channel(self) -> bool:
        """One scale per token and one per weight row: the int8 products' sums can span K
        (:func:`.triton.int8_gemm.per_channel_sum`)."""
        return self.act_group == -1 and self.weight_group == -1

    def describe(self) -> str:
        """One line naming the problem, e.g. ``a8 w4a8-lqq M=16 N=4096 K=4096 act=-1 float16 sm_90 132 SMs``."""
        cap = f"sm_{self.capability[0]}{self.capability[1]}" if self.capability != (0, 0) else "no GPU"
        return (f"{self.op} {'+'.join(self.layouts)} M={self.m} N={self.n} K={self.k} act={self.act_group} "
                f"{str(self.dtype).replace('torch.', '')} {cap} {self.sms} SMs")


@functools.lru_cache(maxsize=16)
def device_traits(device: torch.device) -> tuple[tuple[int, int], int]:
    """(compute capability, SM count) of a CUDA ``device``; ((0, 0), 0) for any other device."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return (0, 0), 0
    props = torch.cuda.get_device_properties(device)
    return (props.major, props.minor), int(props.multi_processor_count)


class GemmKernel:
    """A kernel of the registry. Subclasses set ``name`` (``backend.kernel``) and ``ops`` and implement the three
    methods; ``configs`` may return several launches, tried in order (a launch that does not build here is
    declined and the next one runs)."""

    name: str = ""
    ops: tuple[str, ...] = ()

    def can_implement(self, p: GemmProblem) -> tuple[bool, str]:
        """(True, "") when this kernel can run ``p`` (its hard requirements: layouts, activation groups, device),
        else (False, the reason)."""
        raise NotImplementedError

    def picks(self, p: GemmProblem) -> tuple[bool, str]:
        """(True, "") when this kernel's launch rule picks it for ``p`` among the kernels that can run it (the
        priority list consults it; a forced kernel skips it), else (False, why not)."""
        return True, ""

    def configs(self, p: GemmProblem) -> list:
        """The launch configs for ``p``, in the order to try them (None entries: the rule has no launch here)."""
        return [None]

    def candidates(self, p: GemmProblem) -> list:
        """The launch configs ``quantkit tune`` times for ``p`` (called when :meth:`can_implement` is ok): the
        rule's own, and alternatives where the kernel has any."""
        return [c for c in self.configs(p) if c is not None] or ([None] if self.configs(p) == [None] else [])

    def config_to_json(self, config) -> object:
        """``config`` as JSON data (for the tuned tables)."""
        return list(config) if isinstance(config, tuple) else config

    def config_from_json(self, data) -> object:
        """The config that :meth:`config_to_json` wrote as ``data``."""
        return tuple(data) if isinstance(data, list) else data

    def accepts(self, p: GemmProblem, call, config) -> str | None:
        """None when this call's tensors (``call``, the entry point's arguments) can run ``config``, else why not."""
        return None

    def launch(self, p: GemmProblem, call, config) -> torch.Tensor | None:
        """Y for the call, or None when the launch declined (the config did not build on this device)."""
        raise NotImplementedError

    def bind(self, p: GemmProblem, call, config) -> Callable | None:
        """A launch of ``config`` prepared for repeated calls like ``call`` that differ only in their activations
        (a layer's decode step), or None where this kernel has no such form. Called as ``f(x)`` for ``a16`` and
        ``f(codes, scales)`` for the int8 operations; it returns Y, or None for a call it cannot take (then
        :func:`run` serves that call). By default the choice alone is kept: a call checks its tensors
        (:meth:`accepts`) and launches ``config``; ``call.ACTIVATIONS`` names the fields the arguments replace
        (the template drops this call's own, which a layer's cached launches must not keep alive)."""
        names = call.ACTIVATIONS
        template = replace(call, **dict.fromkeys(names))

        def launch_bound(*activations):
            c = replace(template, **dict(zip(names, activations)))
            return None if self.accepts(p, c, config) is not None else self.launch(p, c, config)

        return launch_bound


class KernelChoiceError(QuantkitError, ValueError):
    """A kernel override that cannot be honoured (an unknown name, a kernel that cannot run the problem): a user
    error with one line naming the fix."""


PRIORITY: dict[str, list[GemmKernel]] = {op: [] for op in OPS}


def register(kernel: GemmKernel, *, before: str | None = None) -> GemmKernel:
    """Append ``kernel`` to the priority list of each of its ops (or insert it ahead of the kernel named
    ``before``); a kernel of the same name is replaced in place."""
    for op in kernel.ops:
        lst = PRIORITY[op]
        names = [k.name for k in lst]
        if kernel.name in names:
            lst[names.index(kernel.name)] = kernel
        elif before is not None and before in names:
            lst.insert(names.index(before), kernel)
        else:
            lst.append(kernel)
    _plan.cache_clear()
    return kernel


def kernel_named(name: str) -> GemmKernel:
    """The registered kernel called ``name``; a ValueError listing the known names otherwise."""
    for lst in PRIORITY.values():
        for k in lst:
            if k.name == name:
                return k
    known = sorted({k.name for lst in PRIORITY.values() for k in lst})
    raise KernelChoiceError(f"no kernel named '{name}'; known: {', '.join(known)} (QUANTKIT_KERNEL or kernel= name "
                            "one of them)")


def forced_kernel(op: str, kernel: str | None) -> str | None:
    """The override for an ``op`` product: the ``kernel`` argument, else ``QUANTKIT_KERNEL`` when the kernel it names
    serves ``op`` (None: the priority list decides)."""
    if kernel is not None:
        return kernel
    env = os.environ.get(ENV_KERNEL)
    if env and op in kernel_named(env).ops:
        return env
    return None


@dataclass(frozen=True)
class Choice:
    """One entry of a problem's plan: a kernel, and a launch config (ok) or the reason it declined."""

    kernel: GemmKernel
    ok: bool
    config: object = None
    reason: str = ""


@functools.lru_cache(maxsize=4096)
def _plan(p: GemmProblem, forced: str | None, tables: bool = True, tables_generation: int = 0
          ) -> tuple[Choice, ...]:
    if forced is not None:
        k = kernel_named(forced)
        if p.op not in k.ops:
            raise KernelChoiceError(f"kernel '{forced}' does not serve {p.op} products ({p.describe()})")
        ok, why = k.can_implement(p)
        if not ok:
            raise KernelChoiceError(f"kernel '{forced}' cannot run {p.describe()}: {why}")
        cfgs = k.configs(p)
        if not cfgs:
            raise KernelChoiceError(f"kernel '{forced}' has no launch config for {p.describe()} (its launch rule "
                                    "does not cover this size)")
        return tuple(Choice(k, True, cfg) for cfg in cfgs)
    out = []
    tuned = _tuned_choice(p) if tables else None
    if tuned is not None:
        out.append(tuned)
    for k in PRIORITY[p.op]:
        ok, why = k.can_implement(p)
        if ok:
            ok, why = k.picks(p)
        out.extend([Choice(k, True, cfg) for cfg in k.configs(p)] if ok else [Choice(k, False, reason=why)])
    return tuple(out)


def _tuned_choice(p: GemmProblem) -> Choice | None:
    """The tuned tables' (kernel, config) for ``p`` (:mod:`.tables`) where one applies and that kernel can run ``p``."""
    from quantkit.runtime.kernels.tables import lookup

    entry = lookup(p)
    if entry is None:
        return None
    try:
        k = kernel_named(entry["kernel"])
        config = k.config_from_json(entry["config"])
    except (ValueError, TypeError, KeyError):
        return None  # a table written by another version: a kernel or a config form this one lacks
    ok, _ = k.can_implement(p)
    if not ok or p.op not in k.ops:
        return None
    return Choice(k, True, config, reason=f"tuned at M={entry['m']}")


def plan(p: GemmProblem, forced: str | None = None) -> tuple[Choice, ...]:
    """Every kernel of ``p``'s priority list in order, each launch config it would try or why it declines (only
    the forced kernel's configs when ``forced`` names one), preceded by the tuned tables' choice where one applies
    (``QUANTKIT_TUNED_TABLES=0`` leaves the tables out); cached per problem."""
    from quantkit.runtime.kernels.tables import generation

    return _plan(p, forced, os.environ.get(ENV_TABLES) != "0", generation())


def run_config(p: GemmProblem, call, kernel: str, config) -> torch.Tensor:
    """Y of ``call`` from kernel ``kernel`` with launch ``config`` exactly (``quantkit tune``'s candidates): a
    ValueError naming the reason where the kernel cannot run the problem or declines the call."""
    k = kernel_named(kernel)
    ok, why = k.can_implement(p) if p.op in k.ops else (False, f"it does not serve {p.op} products")
    why = why if not ok else k.accepts(p, call, config)
    if why is None:
        y = k.launch(p, call, config)
        if y is not None:
            return y
        why = "the launch did not build on this device"
    raise KernelChoiceError(f"kernel '{kernel}' with {config!r} cannot run {p.describe()}: {why}")


def run(p: GemmProblem, call, forced: str | None = None, on_decline: Callable[[Choice, str], None] | None = None
        ) -> torch.Tensor:
    """Y of ``call`` from the first (kernel, config) of :func:`plan` that accepts the call and launches. The last
    kernel of every priority list accepts every call, so this returns unless a forced kernel declines it (a
    ValueError naming why)."""
    last = ""
    for c in plan(p, forced):
        if not c.ok:
            continue
        why = c.kernel.accepts(p, call, c.config)
        if why is None:
            y = c.kernel.launch(p, call, c.config)
            if y is not None:
                return y
            why = "the launch did not build on this device"
        if on_decline is not None:
            on_decline(c, why)
        last = why
    if forced is not None:
        raise KernelChoiceError(f"kernel '{forced}' declined {p.describe()}: {last}")
    raise RuntimeError(f"no kernel ran {p.describe()}: {last}")


def selection_state() -> tuple:
    """What a choice depends on besides the problem: the ``QUANTKIT_KERNEL`` override, ``QUANTKIT_TUNED_TABLES``
    and the tuned tables' generation (a prepared launch, :func:`bind`, is made again when it changes)."""
    from quantkit.runtime.kernels.tables import generation

    return os.environ.get(ENV_KERNEL), os.environ.get(ENV_TABLES) != "0", generation()


def bind(p: GemmProblem, call, forced: str | None = None) -> Callable | None:
    """The prepared launch (:meth:`GemmKernel.bind`) of the (kernel, config) :func:`run` would choose for
    ``call``, or None when that kernel has no prepared form or none accepts the call: the choice made once for a
    (layer, token count), so that a repeated call costs the launch alone."""
    for c in plan(p, forced):
        if c.ok and c.kernel.accepts(p, call, c.config) is None:
            return c.kernel.bind(p, call, c.config)
    return None


def explain(p: GemmProblem) -> list[tuple[str, bool, str]]:
    """(kernel name, chosen, config or the reason it declined) for each entry of ``p``'s plan up to and including
    the first that can run — what ``quantkit bench --explain`` prints. Tensor-level checks (alignment, a kernel
    that failed to build in this process) are not part of it."""
    rows = []
    for c in plan(p):
        cfg = ("default" if c.config is None else repr(c.config)) + (f" ({c.reason})" if c.reason else "")
        rows.append((c.kernel.name, c.ok, cfg if c.ok else c.reason))
        if c.ok:
            break
    return rows
