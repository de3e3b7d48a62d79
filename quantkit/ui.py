"""Rich consoles, progress and message lines shared by the CLI commands (progress and tables go to stderr when stdout
carries JSON).

Verbosity is set once per command by the ``quantkit`` callback (``-q/--quiet``, ``-v/--verbose``):

* quiet: no progress and no informational lines; results (tables, JSON), warnings and errors still print;
* normal: progress and informational lines;
* verbose: also :func:`detail` lines, and the HF/transformers warnings quantkit otherwise silences
  (:func:`quantkit.model.loader.quiet_hf` asks :func:`verbose`).

Progress on a terminal is a live rich bar. When stderr is not a terminal (a log file, a pipe, a job scheduler) a
live bar would be written only when its step ends, so progress is printed instead as plain lines every
:data:`LOG_INTERVAL_S` seconds or :data:`LOG_STEP` of the total, like
``gptq layers 3/8 (37 %) elapsed 0:12 eta 0:20``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

err_console = Console(stderr=True)
out_console = Console()

QUIET, NORMAL, VERBOSE = -1, 0, 1
LOG_INTERVAL_S = 10.0  # a plain progress line at least this often while a step runs
LOG_STEP = 0.1  # and one each time the step passes another tenth of its total
LOG_MIN_GAP_S = 1.0  # but never more often than this (a quick step logs its end only)

_verbosity = NORMAL
_transient = False
_clock = time.monotonic  # tests replace it


def set_verbosity(level: int) -> None:
    """Set how much the commands print: :data:`QUIET`, :data:`NORMAL` or :data:`VERBOSE`."""
    global _verbosity
    _verbosity = max(QUIET, min(VERBOSE, int(level)))


def verbosity() -> int:
    """The current verbosity (:data:`QUIET`, :data:`NORMAL` or :data:`VERBOSE`)."""
    return _verbosity


def quiet() -> bool:
    """Whether progress and informational lines are hidden (``-q``)."""
    return _verbosity <= QUIET


def verbose() -> bool:
    """Whether extra detail (and the HF libraries' own warnings) is shown (``-v``)."""
    return _verbosity >= VERBOSE


@contextlib.contextmanager
def transient_progress() -> Iterator[None]:
    """Live progress bars opened inside this context vanish when their step ends (the demo keeps one line per
    finished step on the screen instead); plain progress lines on a non-terminal are unchanged."""
    global _transient
    saved, _transient = _transient, True
    try:
        yield
    finally:
        _transient = saved


def info(message: str, console: Console | None = None) -> None:
    """An informational line (e.g. where a file was written), hidden by ``-q``; stderr unless ``console``."""
    if not quiet():
        (console or err_console).print(message, markup=False, highlight=False, soft_wrap=True)


def detail(message: str) -> None:
    """A line shown only with ``-v`` (on stderr)."""
    if verbose():
        err_console.print(message, markup=False, highlight=False, soft_wrap=True)


def warn(message: str) -> None:
    """One yellow ``warning: ...`` line on stderr (shown at every verbosity)."""
    err_console.print(Text.assemble(("warning: ", "bold yellow"), message), highlight=False, soft_wrap=True)


def _clock_text(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class _LogLines:
    """Plain progress lines for one step on a console that is not a terminal."""

    def __init__(self, console: Console, description: str, total: int | None):
        self.console, self.description, self.total = console, description, total
        self.start = self.last_emit = _clock()
        self.done = 0
        self.emitted: tuple[int, int | None] | None = None  # (done, total) of the last line
        self.next_step = LOG_STEP

    def line(self) -> str:
        """The progress line for the current state."""
        elapsed = _clock() - self.start
        total = self.total
        if not total:
            return f"{self.description} {self.done} elapsed {_clock_text(elapsed)}"
        frac = min(1.0, self.done / total)
        eta = f" eta {_clock_text(elapsed / self.done * (total - self.done))}" if 0 < self.done < total else ""
        return f"{self.description} {self.done}/{total} ({int(frac * 100)} %) elapsed {_clock_text(elapsed)}{eta}"

    def emit(self) -> None:
        """Print the current state (once per state)."""
        if self.emitted == (self.done, self.total):
            return
        self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)
        self.emitted = (self.done, self.total)
        self.last_emit = _clock()

    def update(self, done: int, total: int | None) -> None:
        """Record progress; print a line when the step ends, every LOG_INTERVAL_S, or past another LOG_STEP."""
        self.done, self.total = done, total if total is not None else self.total
        now = _clock()
        if self.total and done >= self.total:
            self.emit()
            return
        gap = now - self.last_emit
        passed_step = bool(self.total) and done / self.total >= self.next_step
        if passed_step:
            self.next_step = (int(done / self.total / LOG_STEP) + 1) * LOG_STEP
        if gap >= LOG_INTERVAL_S or (passed_step and gap >= LOG_MIN_GAP_S):
            self.emit()


@contextlib.contextmanager
def progress_group(*descriptions: str, totals: tuple[int | None, ...] | None = None,
                   console: Console | None = None) -> Iterator[tuple[Callable[[int, int], None], ...]]:
    """Progress of several steps shown together (stderr unless ``console``); yields one ``update(done, total)``
    per description. A live rich display on a terminal, plain periodic lines otherwise (a log file), nothing with
    ``-q``."""
    console = console or err_console
    totals = totals or (None,) * len(descriptions)
    if quiet():
        yield tuple((lambda done, total: None) for _ in descriptions)
        return
    if not console.is_terminal:
        logs = [_LogLines(console, d, t) for d, t in zip(descriptions, totals)]
        try:
            yield tuple(log.update for log in logs)
        finally:
            for log in logs:
                if log.emitted is not None or log.done:  # a step that ran: end on its last state
                    log.emit()
        return
    with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=_transient) as prog:
        tasks = [prog.add_task(d, total=t) for d, t in zip(descriptions, totals)]

        def updater(task):
            return lambda done, tot: prog.update(task, completed=done, total=tot)

        yield tuple(updater(task) for task in tasks)


@contextlib.contextmanager
def progress_bar(description: str, total: int | None = None,
                 console: Console | None = None) -> Iterator[Callable[[int, int], None]]:
    """Progress of one step on stderr (or ``console``); yields ``update(done, total)``. See
    :func:`progress_group` for what is shown where."""
    with progress_group(description, totals=(total,), console=console) as (update,):
        yield update
