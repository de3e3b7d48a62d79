"""A QuantLinear prepares its kernel's launch once per (token count, dtype) and then only launches it: the choice
is made once per layer and token count (dispatch.register's ``bind``), so eager decoding pays a lookup, not a
kernel search, per call. On the CPU a stand-in kernel checks the caching rules; on a GPU the prepared decode GEMVs
must give the unprepared launches' bits."""

from __future__ import annotations

import gc
import os
import weakref

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch  # noqa: E402
from tests.kernels_helpers import DEVICE, packed  # noqa: E402

CUDA = torch.cuda.is_available()


def _linear(layout: str = "w4a16", n: int = 40, k: int = 256, act: ActQuant | None = None) -> QuantLinear:
    qw, tensors, meta = packed(layout, n, k, 128 if layout != "w8" else -1)
    return QuantLinear(k, n, [PackedPart(layout, meta, tensors, None, qw.bits)], act=act)


@pytest.fixture
def stand_in(monkeypatch):
    """A 'w4a16' kernel on DEVICE whose entry is the torch reference and whose ``bind`` counts the launches it
    prepares; ``state["selection"]`` is what its choice depends on, ``state["decline"]`` makes a prepared launch
    turn a call down."""
    state = {"binds": 0, "bound_calls": 0, "entry_calls": 0, "selection": "a", "decline": False}

    def entry(x, tensors, meta, act, shared=None):
        state["entry_calls"] += 1
        with monkeypatch.context() as m:
            m.setattr(dispatch, "_KERNELS", {})
            return ql_for_reference[0](x)

    def bind(x, tensors, meta, act, shared):
        state["binds"] += 1
        m = x.shape[0]

        def run(x, shared):
            assert x.shape[0] == m
            if state["decline"]:
                return None
            state["bound_calls"] += 1
            with monkeypatch.context() as mp:
                mp.setattr(dispatch, "_KERNELS", {})
                return ql_for_reference[0](x)
        return run

    ql_for_reference = [None]
    monkeypatch.delenv(dispatch.ENV_SWITCH, raising=False)
    monkeypatch.setattr(dispatch, "_KERNELS", dict(dispatch._KERNELS))
    dispatch.register("w4a16", entry, quantizes_activations=True, shared_activation=True, devices=(DEVICE,),
                      bind=bind, selection=lambda: state["selection"])
    state["set_layer"] = lambda ql: ql_for_reference.__setitem__(0, ql)
    return state


def test_a_layer_binds_once_per_token_count_and_reuses_it(stand_in):
    ql = _linear()
    stand_in["set_layer"](ql)
    x1, x4 = torch.randn(1, 256).half().to(DEVICE), torch.randn(2, 2, 256).half().to(DEVICE)
    first = ql(x1)
    for _ in range(3):
        assert torch.equal(ql(x1), first)
    ql(x4)
    ql(x4)
    assert stand_in["binds"] == 2 and stand_in["bound_calls"] == 6 and stand_in["entry_calls"] == 0


def test_a_new_selection_moved_buffers_or_a_replaced_buffer_bind_again(stand_in):
    ql = _linear()
    stand_in["set_layer"](ql)
    x = torch.randn(1, 256).half().to(DEVICE)
    ql(x)
    stand_in["selection"] = "b"  # e.g. QUANTKIT_KERNEL set, or a tune wrote new tables
    ql(x)
    assert stand_in["binds"] == 2
    ql.to(DEVICE)  # _apply: the packed buffers may have moved
    ql(x)
    assert stand_in["binds"] == 3
    ql.qweight = ql.qweight.clone()
    ql(x)
    assert stand_in["binds"] == 4



def test_buffers_swapped_past_the_module_stop_its_prepared_launches(stand_in):
    """Offload hooks swap a layer's buffers in _buffers before each forward: the layer drops its prepared launches,
    so they keep no old copy alive, and prepares none again (each would serve one call)."""
    import gc
    import weakref

    ql = _linear()
    stand_in["set_layer"](ql)
    x = torch.randn(1, 256).half().to(DEVICE)
    want = ql(x)
    assert stand_in["binds"] == 1
    olds = []
    for _ in range(4):
        olds.append(weakref.ref(ql._buffers["qweight"]))
        ql._buffers["qweight"] = ql._buffers["qweight"].clone()
        assert torch.equal(ql(x), want)
    gc.collect()
    assert stand_in["binds"] == 1 and not ql._launches
    assert sum(ref() is not None for ref in olds) == 0


def _mixed_linear() -> QuantLinear:
    """A W4.4A8 layer: 36 4-bit rows and 4 8-bit rows of a 40×256 weight, A8 activations."""
    rows8 = torch.tensor([1, 9, 20, 33], dtype=torch.int32)
    rows4 = torch.tensor([r for r in range(40) if r not in rows8.tolist()], dtype=torch.int32)
    parts = []
    for layout, rows, bits in (("w4a16", rows4, 4), ("w8", rows8, 8)):
        _, tensors, meta = packed(layout, len(rows), 256, 128, seed=bits)
        parts.append(PackedPart(layout, meta, tensors, rows.to(DEVICE), bits))
    return QuantLinear(256, 40, parts, act=ActQuant(8, 128)).to(DEVICE)


def test_a_mixed_layer_binds_its_one_launch_kernel_once_per_token_count(monkeypatch):
    """The one-launch mixed kernel's prepared launch (register_mixed's ``bind``) is made once per token count and
    dropped for good when a hook swaps a partition's buffers (they sit in child modules)."""
    state = {"binds": 0, "bound_calls": 0, "entry_calls": 0}
    ql = _mixed_linear()

    def reference(x):
        with monkeypatch.context() as m:
            m.setattr(dispatch, "_MIXED", {})
            m.setattr(dispatch, "_KERNELS", {})
            return ql(x)

    def entry(x, parts, out_features, act, shared=None):
        state["entry_calls"] += 1
        return reference(x)

    def bind(x, parts, out_features, act, shared):
        state["binds"] += 1
        assert [p[0] for p in parts] == ["w4a16", "w8"] and out_features == 40

        def run(x, shared):
            state["bound_calls"] += 1
            return reference(x)
        return run

    monkeypatch.delenv(dispatch.ENV_SWITCH, raising=False)
    monkeypatch.setattr(dispatch, "_MIXED", dict(dispatch._MIXED))
    dispatch.register_mixed(entry, lambda layouts, act: True, devices=(DEVICE,), bind=bind, selection=lambda: "a")
    x1, x3 = torch.randn(1, 256).half().to(DEVICE), torch.randn(3, 256).half().to(DEVICE)
    want = reference(x1)
    for _ in range(3):
        assert torch.equal(ql(x1), want)
    ql(x3)
    assert state == {"binds": 2, "bound_calls": 4, "entry_calls": 0}
    ql.part8._buffers["qweight"] = ql.part8._buffers["qweight"].clone()  # an offload hook's swap
    assert torch.equal(ql(x1), want)
    assert state["binds"] == 2 and state["entry_calls"] == 1 and not ql._launches


def test_a_call_the_prepared_launch_declines_runs_the_entry(stand_in):
    ql = _linear()
    stand_in["set_layer"](ql)
    x = torch.randn(3, 256).half().to(DEVICE)
    want = ql(x)
    stand_in["decline"] = True
    assert torch.equal(ql(x), want)
    assert stand_in["entry_calls"] == 1 and stand_in["binds"] == 1


def test_the_launch_cache_stays_small_under_many_prompt_lengths(stand_in):
    from quantkit.runtime.quant_linear import MAX_LAUNCHES

    ql = _linear()
    stand_in["set_layer"](ql)
    for m in range(1, MAX_LAUNCHES + 10):
        ql(torch.randn(m, 256).half().to(DEVICE))
    assert len(ql._launches) <= MAX_LAUNCHES


@pytest.mark.parametrize("layout", ["w4a16", "w4a8-lqq"])
def test_a_prepared_registry_launch_keeps_the_choice_not_the_activation(layout):
    from quantkit.quant.act import quantize_activation_int
    from quantkit.runtime.kernels import gemm

    _, tensors, meta = packed(layout, 40, 256, 128 if layout == "w4a16" else -1)
    xs = [torch.randn(16, 256, generator=torch.Generator().manual_seed(i)).half().to(DEVICE) for i in range(2)]
    if layout == "w4a16":
        bound = gemm.bind_w4a16(xs[0], tensors, meta)
        expect = [gemm.w4a16_matmul(x, tensors, meta) for x in xs]
    else:
        xs = [tuple(t.to(DEVICE) for t in quantize_activation_int(x.cpu(), 8, -1)) for x in xs]
        xs = [(codes, scales.float()) for codes, scales in xs]
        bound = gemm.bind_int8(*xs[0], -1, [(layout, tensors, meta, None)], 40, torch.float16)
        expect = [gemm.int8_matmul(*x, -1, layout, tensors, meta) for x in xs]
    first = weakref.ref(xs[0] if layout == "w4a16" else xs[0][0])
    xs[0] = None
    gc.collect()
    assert first() is None, "a prepared launch must not keep its first call's activations alive"
    got = bound(xs[1]) if layout == "w4a16" else bound(*xs[1])
    assert torch.equal(got, expect[1])


@pytest.mark.skipif(not CUDA, reason="the chosen kernels run on a GPU")
@pytest.mark.parametrize("layout,act,dtype,m", [
    ("w4a16", None, torch.float16, 16), ("w4a8-lqq", ActQuant(8, -1), torch.float16, 16),
    ("w4a16", None, torch.float16, 1), ("w4a16", None, torch.bfloat16, 5), ("w4a16", None, torch.float16, 8),
    ("w4a8-lqq", ActQuant(8, -1), torch.float16, 1), ("w4a8-lqq", ActQuant(8, -1), torch.bfloat16, 3),
    ("w8", ActQuant(8, -1), torch.float16, 8), ("w4a16", ActQuant(8, 128), torch.float16, 2),
])
def test_prepared_gemv_gives_the_unprepared_bits(layout, act, dtype, m):
    dispatch.load_kernel_modules()
    ql = _linear(layout, n=4096 + 48, k=1024, act=act).cuda()
    xs = [torch.randn(m, 1024, dtype=dtype, device="cuda", generator=torch.Generator("cuda").manual_seed(i))
          for i in range(3)]
    with torch.no_grad():
        unprepared = []
        for x in xs:
            unprepared.append(dispatch.kernel_for(layout, x.device).fn(x, ql._tensors(""), ql._parts[0][2], act))
        got = [ql(x) for x in xs]
    key = next(iter(ql._launches))
    assert ql._launches[key] is not None, "the chosen kernel's launch should be prepared for this layer"
    for g, u in zip(got, unprepared):
        assert torch.equal(g, u)


@pytest.mark.skipif(not CUDA, reason="the prepared launches are the CUDA decode GEMVs")
def test_prepared_gemv_turns_down_a_strided_input_and_the_entry_runs_it():
    dispatch.load_kernel_modules()
    ql = _linear("w4a16", n=4096, k=1024).cuda()
    x = torch.randn(1, 1024, dtype=torch.float16, device="cuda")
    wide = torch.randn(1, 2048, dtype=torch.float16, device="cuda")[:, :1024]
    ql(x)
    bound = next(iter(ql._launches.values()))
    assert bound is not None
    assert wide.stride(0) == 2048 and bound(wide, None) is None
    assert torch.equal(ql(wide), ql(wide.contiguous()))
