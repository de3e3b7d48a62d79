"""The kernel registry (quantkit.runtime.kernels.registry / .gemm): every plan ends in a kernel that runs anywhere,
every entry the rules pick has a launch, an override names one kernel (argument or QUANTKIT_KERNEL) and fails
loudly where it cannot run, and ``bench --explain`` shows the choice."""

from __future__ import annotations

import json
import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels import registry  # noqa: E402
from quantkit.runtime.kernels.gemm import int8_matmul, w4a16_matmul  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference, w4a16_reference  # noqa: E402
from quantkit.runtime.kernels.registry import GemmProblem, PRIORITY, explain, plan  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, rel_err  # noqa: E402

SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (512, 3584), (1536, 2048), (100, 512)]
MS = [1, 3, 8, 16, 17, 31, 64, 96, 128, 257, 416, 512, 577, 700, 1024, 2048, 4096]
METHODS = [("a16", ("w4a16",), 0), ("a8", ("w8",), 128), ("a8", ("w8",), -1), ("a8", ("w4a16",), 128),
           ("a8", ("w4a8-lqq",), -1), ("a8", ("w4a8-lqq",), 128), ("a8_mixed", ("w4a16", "w8"), 128)]
HOPPER = ((9, 0), 132, frozenset({"cupy", "gluon"}))
AMPERE = ((8, 0), 108, frozenset({"cupy"}))
CPU = ((0, 0), 0, frozenset())


@pytest.mark.parametrize("device", [HOPPER, AMPERE, CPU], ids=["sm90", "sm80", "cpu"])
def test_every_plan_ends_in_a_kernel_that_runs_everywhere_and_every_pick_has_a_launch(device):
    cap, sms, tools = device
    for n, k in SHAPES:
        for m in MS:
            for op, layouts, act in METHODS:
                p = GemmProblem(op, layouts, m, n, k, act, torch.float16, cap, sms, tools)
                entries = plan(p)
                assert entries[-1].ok and entries[-1].kernel.name.startswith("triton."), p.describe()
                for c in entries:
                    if c.ok and c.kernel.configs(p) != [None]:
                        assert c.config is not None, (c.kernel.name, p.describe())
                    if not c.ok:
                        assert c.reason, (c.kernel.name, p.describe())
                rows = explain(p)
                assert rows[-1][1] and not any(ok for _, ok, _ in rows[:-1])
                if cap == (0, 0):  # no GPU: only the Triton kernels (interpreted)
                    assert rows[-1][0].startswith("triton."), p.describe()


class _ArgsChecked(Exception):
    """Raised in place of reading a kernel's operands: the wrapper's own checks of its launch arguments passed."""


def _launch_args_checker(monkeypatch):
    """A function (kernel name, launch config) -> None that runs the kernel wrapper's own checks of its launch
    arguments (the ValueError a wrapper raises before any GPU work, a CUDA instance's launch checks), raising the
    wrapper's ValueError where it refuses the launch; Triton tiles are checked for what the Triton kernels compile
    (power-of-two tiles of at least 16, warps and stages)."""
    from quantkit.runtime.kernels.cuda.lqq_cluster import _check_launch
    from quantkit.runtime.kernels.gluon_sm90 import lqq_wgmma, lqq_ws, w4a16_wgmma, w4a16_ws, w8a8_wgmma
    from quantkit.runtime.kernels.triton.launch import TileConfig

    def stop(*args, **kwargs):
        raise _ArgsChecked

    for module, name in ((lqq_wgmma, "lqq_operands"), (lqq_ws, "lqq_operands"), (w4a16_wgmma, "w4a16_operands"),
                         (w4a16_ws, "w4a16_operands")):
        monkeypatch.setattr(module, name, stop)

    class Codes:  # w8a8_wgmma_matmul reads the codes' shape right after its checks
        @property
        def shape(self):
            raise _ArgsChecked

    def power_of_two(v, least=1):
        return v >= least and v & (v - 1) == 0

    def check(name, cfg):
        try:
            if name == "cuda.lqq_cluster":
                _check_launch(*cfg)
            elif name == "gluon_sm90.lqq_ws_k_pair":
                lqq_ws.lqq_ws_matmul(None, None, {}, {}, *cfg, k_pair=True)
            elif name == "gluon_sm90.lqq" and cfg.kernel == lqq_wgmma.KERNEL:
                assert cfg.halves_from is None, cfg
                lqq_wgmma.lqq_wgmma_matmul(None, None, {}, {}, *cfg.args)
            elif name == "gluon_sm90.lqq":
                assert cfg.kernel in (lqq_ws.KERNEL, lqq_ws.HALVES_KERNEL), cfg
                assert (cfg.kernel == lqq_ws.HALVES_KERNEL) == (cfg.halves_from is not None), cfg
                halves = {} if cfg.halves_from is None else {"halves_from": cfg.halves_from}
                lqq_ws.lqq_ws_matmul(None, None, {}, {}, *cfg.args, **halves)
            elif name in ("gluon_sm90.w8a8", "gluon_sm90.w8a8_mixed"):
                w8a8_wgmma.w8a8_wgmma_matmul(Codes(), None, -1, {}, {}, *cfg)
            elif name == "gluon_sm90.w4a16_ws":
                w4a16_ws.w4a16_ws_matmul(None, {}, {}, *cfg)
            elif name == "gluon_sm90.w4a16_wgmma":
                w4a16_wgmma.w4a16_wgmma_matmul(None, {}, {}, *cfg)
            elif isinstance(cfg, TileConfig):
                assert name in ("triton.int8", "triton.int8_mixed", "triton.w4a16"), (name, cfg)
                assert (power_of_two(cfg.bn, 16) and power_of_two(cfg.bm, 16) and cfg.split_k >= 1
                        and power_of_two(cfg.num_warps) and cfg.num_stages >= 1), cfg
            else:
                assert cfg is None, (name, cfg)  # the GEMVs and dequantize-then-cuBLAS take no launch config
        except _ArgsChecked:
            pass

    return check


def test_every_default_and_tune_launch_is_one_its_kernel_takes(monkeypatch):
    """Selection rules are checked by invariants, not by their particular choices: on a Hopper GPU, over layers of
    512-28672 rows and 3584-14336 columns at 1-4096 tokens, every launch config of each kernel's default rule
    (where it picks the kernel) and of its tune space is one the kernel's own argument checks accept — none of them
    can fail before it runs. (That every one is bit-exact against the reference is checked per kernel on the GPU.)"""
    check = _launch_args_checker(monkeypatch)
    cap, sms, tools = HOPPER
    ms = sorted({*range(1, 4097, 23), 8, 9, 16, 17, 31, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513, 768, 769,
                 1024, 1025, 2048, 4096})
    seen = set()
    for n in (512, 1024, 4096, 6144, 14336, 28672):
        for k in (3584, 4096, 14336):
            for m in ms:
                for op, layouts, act in METHODS:
                    p = GemmProblem(op, layouts, m, n, k, act, torch.float16, cap, sms, tools)
                    for kernel in PRIORITY[op]:
                        if not kernel.can_implement(p)[0]:
                            continue
                        defaults = kernel.configs(p) if kernel.picks(p)[0] else []
                        for cfg in defaults + kernel.candidates(p):
                            key = (kernel.name, cfg if not isinstance(cfg, list) else tuple(cfg))
                            if key in seen:
                                continue
                            seen.add(key)
                            try:
                                check(kernel.name, cfg)
                            except (ValueError, AssertionError) as e:
                                pytest.fail(f"{kernel.name} {cfg!r} at {p.describe()}: {e}")
    # the fp8 operation's kernels (cuBLAS, torch) have no launch configs of their own
    assert {name for name, _ in seen} >= {k.name for op, kernels in PRIORITY.items() if op != "fp8" for k in kernels}


def test_priority_lists_name_each_kernel_once_and_serve_their_ops():
    layouts = {"a8": ("w8",), "a8_mixed": ("w4a16", "w8"), "a16": ("w4a16",), "fp8": ("fp8",)}
    assert set(PRIORITY) == set(layouts)
    for op, kernels in PRIORITY.items():
        names = [k.name for k in kernels]
        assert len(names) == len(set(names))
        assert all(op in k.ops for k in kernels)
        no_gpu = GemmProblem(op, layouts[op], 3, 7, 200, -1, torch.float16)
        assert kernels[-1].can_implement(no_gpu)[0], f"the last {op} kernel must take every problem"


def _a8(m, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes, scales = quantize_activation_int(torch.randn(m, k, generator=g) * 2, 8, -1)
    return codes.to(DEVICE), scales.float().to(DEVICE)


def test_an_override_names_one_kernel_by_argument_or_environment(monkeypatch):
    _, tensors, meta = packed("w8", 100, 512, -1, seed=1, sym=True)
    codes, scales = _a8(5, 512)
    ref = int8_reference(codes, scales, -1, "w8", tensors, meta)
    got = int8_matmul(codes, scales, -1, "w8", tensors, meta, kernel="triton.int8")
    assert rel_err(got, ref) < 1e-3
    monkeypatch.setenv(registry.ENV_KERNEL, "triton.int8")
    assert torch.equal(int8_matmul(codes, scales, -1, "w8", tensors, meta), got)
    # the variable names an a8 kernel: an a16 product is chosen as usual
    _, t16, m16 = packed("w4a16", 100, 512, 128, seed=2)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3)).half().to(DEVICE)
    assert rel_err(w4a16_matmul(x, t16, m16), w4a16_reference(x, t16, m16)) < 1e-2
    monkeypatch.setenv(registry.ENV_KERNEL, "no.such_kernel")
    with pytest.raises(ValueError, match="no kernel named 'no.such_kernel'; known: .*triton.int8"):
        int8_matmul(codes, scales, -1, "w8", tensors, meta)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is present")
def test_a_forced_kernel_that_cannot_run_is_an_error_naming_why():
    from quantkit.errors import QuantkitError

    _, tensors, meta = packed("w8", 100, 512, -1, seed=1, sym=True)
    codes, scales = _a8(5, 512)
    with pytest.raises(ValueError, match="kernel 'cuda.a8_gemv' cannot run a8 w8 M=5 N=100 K=512.*needs a CUDA GPU"):
        int8_matmul(codes, scales, -1, "w8", tensors, meta, kernel="cuda.a8_gemv")
    with pytest.raises(QuantkitError, match="does not serve a8 products"):  # a user error: one line in the CLI
        int8_matmul(codes, scales, -1, "w8", tensors, meta, kernel="triton.w4a16")
    big = GemmProblem("a8", ("w8",), 17, 4096, 4096, 128, torch.float16, (9, 0), 132, frozenset({"cupy", "gluon"}))
    with pytest.raises(ValueError, match="cuda.a8_gemv' cannot run.*1-16 tokens"):
        plan(big, "cuda.a8_gemv")
    small = GemmProblem("a8", ("w8",), 8, 4096, 4096, 128, torch.float16, (9, 0), 132, frozenset({"cupy", "gluon"}))
    with pytest.raises(ValueError, match="gluon_sm90.w8a8' has no launch config"):
        plan(small, "gluon_sm90.w8a8")


def test_bench_explain_prints_the_choice_for_a_named_gpu(tmp_path):
    from typer.testing import CliRunner

    from quantkit.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["bench", "--explain", "--shapes", "6144x4096", "--m", "1,64,2048", "--methods",
                            "w4a16,w4a8-lqq,fp16", "--assume-gpu", "9.0:132", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout.strip().splitlines()[-1])
    assert {(x["m"], x["method"]) for x in rows} == {(m, meth) for m in (1, 64, 2048) for meth in ("w4a16", "w4a8-lqq")}
    by = {(x["m"], x["method"]): x for x in rows}
    assert by[(1, "w4a16")]["kernel"] == "cuda.w4a16_gemv" and by[(1, "w4a16")]["declined"] == []
    assert all(d["reason"] for x in rows for d in x["declined"])
    bad = runner.invoke(app, ["bench", "--explain", "--shapes", "64x256", "--assume-gpu", "H100"])
    assert bad.exit_code == 2 and "--assume-gpu takes MAJOR.MINOR:SMS" in bad.output
    lone = runner.invoke(app, ["bench", "--shapes", "64x256", "--assume-gpu", "9.0:132"])
    assert lone.exit_code == 2 and "--assume-gpu goes with --explain" in lone.output


def _problem(m, device="NVIDIA Test GPU", n=4096, k=4096):
    return GemmProblem("a8", ("w4a8-lqq",), m, n, k, -1, torch.float16, (9, 0), 132, frozenset({"cupy", "gluon"}),
                       device)


def test_a_tuned_table_goes_first_for_its_device_and_rounds_m_up(tmp_path, monkeypatch):
    from quantkit.runtime.kernels import tables

    monkeypatch.setenv(tables.ENV_DIR, str(tmp_path))
    tables.clear_cache()
    entries = [{"n": 4096, "k": 4096, "m": m, "kernel": "triton.int8",
                "config": {"bn": 64, "bm": bm, "split_k": 1, "num_warps": 4, "num_stages": 3}}
               for m, bm in ((16, 16), (256, 64), (4096, 128))]
    path = tables.write_table(tmp_path, "NVIDIA Test GPU", (9, 0), 132, "a8", ("w4a8-lqq",), -1, entries,
                              "quantkit tune --shapes 4096x4096", "abc1234", "2026-11-28T00:00:00Z")
    assert path == tmp_path / "NVIDIA_Test_GPU" / "a8-w4a8-lqq-act-1.json"
    for m, bm in ((1, 16), (16, 16), (17, 64), (256, 64), (257, 128), (4096, 128)):
        first = plan(_problem(m))[0]
        assert first.kernel.name == "triton.int8" and first.config.bm == bm and "tuned" in first.reason, m
    assert "tuned" not in plan(_problem(4097))[0].reason  # above the tuned range the launch rules decide
    assert plan(_problem(17, device="Another GPU"))[0].kernel.name != "triton.int8"  # other devices: no table
    assert plan(_problem(17, n=512))[0].reason == ""  # other shapes: no entry
    monkeypatch.setenv(registry.ENV_TABLES, "0")
    assert "tuned" not in plan(_problem(17))[0].reason  # tables hidden: the launch rules alone
    monkeypatch.delenv(registry.ENV_TABLES)
    # a second tune run of the same (N, K, M) replaces that entry and keeps the others
    tables.write_table(tmp_path, "NVIDIA Test GPU", (9, 0), 132, "a8", ("w4a8-lqq",), -1,
                       [{**entries[1], "config": {**entries[1]["config"], "bm": 32}}], "c", "d", "e")
    data = json.loads(path.read_text())
    assert [e["config"]["bm"] for e in data["entries"]] == [16, 32, 128] and data["command"] == "c"
    assert plan(_problem(100))[0].config.bm == 32
    rows = explain(_problem(100))
    assert rows[0][0] == "triton.int8" and "tuned at M=256" in rows[0][2]


def test_a_table_naming_an_unknown_kernel_or_a_bad_file_is_ignored(tmp_path, monkeypatch):
    from quantkit.runtime.kernels import tables

    monkeypatch.setenv(tables.ENV_DIR, str(tmp_path))
    tables.clear_cache()
    tables.write_table(tmp_path, "NVIDIA Test GPU", (9, 0), 132, "a8", ("w4a8-lqq",), -1,
                       [{"n": 4096, "k": 4096, "m": 64, "kernel": "gone.kernel", "config": None}], "c", "d", "e")
    assert plan(_problem(64))[0].kernel.name != "gone.kernel"
    path = tmp_path / "NVIDIA_Test_GPU" / "a8-w4a8-lqq-act-1.json"
    data = json.loads(path.read_text())
    data["entries"] = [{"n": 4096, "k": 4096, "m": 64, "kernel": "triton.int8", "config": {"tile": "from v9"}},
                       {"n": "4096", "kernel": "triton.int8"}, ["not", "an", "entry"]]
    path.write_text(json.dumps(data))
    tables.clear_cache()
    assert "tuned" not in plan(_problem(64))[0].reason  # a config this version cannot read, malformed entries
    for text in ("{not json", "[1, 2]"):
        path.write_text(text)
        tables.clear_cache()
        assert "tuned" not in plan(_problem(64))[0].reason


def test_tune_candidates_include_the_rules_choice_and_only_kernels_that_can_run():
    from quantkit.bench.tune import tune_candidates

    for m in (1, 16, 64, 700, 4096):
        p = _problem(m)
        cands = tune_candidates(p)
        first = next(c for c in plan(p) if c.ok)
        assert (first.kernel.name, first.config) in cands, m
        assert all(registry.kernel_named(name).can_implement(p)[0] for name, _ in cands)
    cpu = GemmProblem("a16", ("w4a16",), 8, 4096, 4096, 0, torch.float16)
    assert {name for name, _ in tune_candidates(cpu)} <= {"triton.w4a16", "triton.w4a16_dequant"}


def test_tune_refuses_without_a_gpu_and_with_no_quantkit_method():
    from typer.testing import CliRunner

    from quantkit.cli import app

    if torch.cuda.is_available():
        pytest.skip("checks the refusal where no GPU is present")
    r = CliRunner().invoke(app, ["tune", "--shapes", "64x256", "--m", "1"])
    assert r.exit_code == 2 and "needs" not in r.output and "CUDA GPU" in r.output


def test_a_tune_run_times_the_default_without_the_tables_it_is_writing(tmp_path, monkeypatch):
    from quantkit.bench.tune import tables_hidden
    from quantkit.runtime.kernels import tables

    monkeypatch.setenv(tables.ENV_DIR, str(tmp_path))
    tables.clear_cache()
    tables.write_table(tmp_path, "NVIDIA Test GPU", (9, 0), 132, "a8", ("w4a8-lqq",), -1,
                       [{"n": 4096, "k": 4096, "m": 256, "kernel": "triton.int8",
                         "config": {"bn": 64, "bm": 16, "split_k": 1, "num_warps": 4, "num_stages": 3}}], "c", "d", "e")
    assert "tuned" in plan(_problem(64))[0].reason
    with tables_hidden():
        assert "tuned" not in plan(_problem(64))[0].reason
    assert "tuned" in plan(_problem(64))[0].reason and os.environ.get(registry.ENV_TABLES) is None


def test_shipped_tables_name_kernels_and_launches_that_can_run_their_entries():
    """Every entry of the shipped tuned tables (kernels/tuned/) names a registered kernel of its op, with a launch
    config that kernel reads back, for a problem that kernel can implement on the table's device."""
    from pathlib import Path

    from quantkit.runtime.kernels import attention_launch, tables

    shipped = Path(tables.__file__).with_name("tuned")
    files = sorted(f for f in shipped.glob("*/*.json") if f.name != attention_launch.TABLE_NAME)
    assert files, "no shipped launch tables"
    for path in files:
        data = json.loads(path.read_text())
        assert data["schema"] == tables.SCHEMA and data["commit"] and data["command"].startswith("quantkit tune")
        assert path.name == tables.table_name(data["op"], tuple(data["layouts"]), data["act_group"])
        for e in data["entries"]:
            k = registry.kernel_named(e["kernel"])
            assert data["op"] in k.ops
            config = k.config_from_json(e["config"])
            assert k.config_to_json(config) == e["config"]
            p = GemmProblem(data["op"], tuple(data["layouts"]), e["m"], e["n"], e["k"], data["act_group"],
                            torch.float16, tuple(data["capability"]), data["sms"], frozenset({"cupy", "gluon"}),
                            data["device"])
            assert k.can_implement(p)[0], (path.name, e)
