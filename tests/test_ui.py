"""quantkit.ui: verbosity (-q hides progress and informational lines, -v lets the HF libraries' warnings through)
and progress on a console that is not a terminal (a log file): periodic plain lines instead of a live bar."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from quantkit import ui


@pytest.fixture(autouse=True)
def _normal_verbosity():
    yield
    ui.set_verbosity(ui.NORMAL)


def _log_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_quiet_hides_progress_and_information_but_not_warnings(monkeypatch):
    console, out = _log_console()
    ui.set_verbosity(ui.QUIET)
    with ui.progress_bar("gptq layers", 4, console=console) as update:
        for i in range(1, 5):
            update(i, 4)
    ui.info("plan written to p.json", console)
    ui.detail("details")
    assert out.getvalue() == ""
    monkeypatch.setattr(ui, "err_console", console)
    ui.warn("--calib-samples is ignored")
    assert out.getvalue() == "warning: --calib-samples is ignored\n"


def test_verbose_shows_details_and_lets_the_hf_warnings_through(monkeypatch):
    from transformers.utils import logging as hf_logging

    from quantkit.model.loader import quiet_hf

    console, out = _log_console()
    monkeypatch.setattr(ui, "err_console", console)
    ui.detail("hidden at normal verbosity")
    ui.set_verbosity(ui.VERBOSE)
    ui.detail("shown with -v")
    assert out.getvalue() == "shown with -v\n"
    quiet_hf()
    assert hf_logging.get_verbosity() == hf_logging.WARNING
    ui.set_verbosity(ui.NORMAL)
    quiet_hf()
    assert hf_logging.get_verbosity() == hf_logging.ERROR


def test_progress_on_a_log_file_prints_periodic_plain_lines(monkeypatch):
    """Not a terminal: a line every LOG_INTERVAL_S or each tenth of the total (at most one per LOG_MIN_GAP_S), and
    the last state; no live bar that would appear only when the step ends."""
    now = [0.0]
    monkeypatch.setattr(ui, "_clock", lambda: now[0])
    console, out = _log_console()
    with ui.progress_bar("gptq layers", console=console) as update:
        for done, t in ((1, 0.5), (2, 12.0), (3, 13.0), (4, 13.5), (6, 26.0), (8, 32.0)):
            now[0] = t
            update(done, 8)
    assert out.getvalue().splitlines() == [
        "gptq layers 2/8 (25 %) elapsed 0:12 eta 0:36",
        "gptq layers 3/8 (37 %) elapsed 0:13 eta 0:22",
        "gptq layers 6/8 (75 %) elapsed 0:26 eta 0:09",
        "gptq layers 8/8 (100 %) elapsed 0:32"]
    out.truncate(0), out.seek(0)
    now[0] = 0.0
    with ui.progress_group("salience samples", console=console) as (update,):  # unknown total
        now[0] = 3.0
        update(5, None)
        now[0] = 11.0
        update(9, None)
        update(10, None)
    assert out.getvalue().splitlines() == ["salience samples 9 elapsed 0:11", "salience samples 10 elapsed 0:11"]
