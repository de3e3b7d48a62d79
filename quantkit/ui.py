"""Rich consoles and progress bars shared by the CLI commands (progress and tables go to stderr when stdout carries
JSON)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

err_console = Console(stderr=True)
out_console = Console()


@contextlib.contextmanager
def progress_bar(description: str, total: int | None = None) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields ``update(done, total)``."""
    with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=False) as prog:
        task = prog.add_task(description, total=total)

        def update(done: int, tot: int) -> None:
            prog.update(task, completed=done, total=tot)

        yield update
