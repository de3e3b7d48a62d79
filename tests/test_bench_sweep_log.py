"""quantkit.bench.sweep_log: the sweep scripts' bit-exactness record (runs on a CPU)."""

from __future__ import annotations

import torch

from quantkit.bench.sweep_log import print_checks, record_check


def test_record_check_marks_equal_bits_and_reports_a_mismatch(capsys):
    checks = []
    a = torch.randn(3, 5)
    record_check(checks, {"launch": "x"}, a, a.clone())
    assert checks == [{"launch": "x", "equal_triton": True}] and capsys.readouterr().out == ""
    b = a.clone()
    b[1, 2] = torch.nextafter(b[1, 2], torch.tensor(float("inf")))  # one value one ulp off: not the same bits
    record_check(checks, {"launch": "y"}, a, b)
    assert checks[-1] == {"launch": "y", "equal_triton": False}
    assert capsys.readouterr().out.startswith('MISMATCH {"launch": "y"')
    print_checks(checks)
    assert capsys.readouterr().out.strip() == "checks: 1 of 2 bit-identical"
