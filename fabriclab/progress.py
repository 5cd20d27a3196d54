"""Progress of long commands, on stderr: bars on a terminal (rich), plain lines elsewhere.

A log file or a CI job gets a line every `PLAIN_EVERY_S` seconds while something runs and one as each
item (a row of `compare`, a run of `sim`) finishes, so a run that takes minutes is never silent. A
terminal gets a bar of items done and one bar per item running, each with its own description.
`--json` runs are quiet (stdout is for the machine; stderr stays clean too).
"""
from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

#: a plain (non-terminal) stream gets a line at most this often while items run
PLAIN_EVERY_S = 5.0


class ProgressView:
    """`items(done, total)` and `running({key: (fraction, description)})` as items advance; `close()` at the end."""

    def __init__(self, title: str, *, quiet: bool = False, stream: IO[str] | None = None,
                 terminal: bool | None = None) -> None:
        self.title = title
        self.stream = stream or sys.stderr
        self.quiet = quiet
        self.terminal = self.stream.isatty() if terminal is None else terminal
        self.done = self.total = 0
        self.last_plain = 0.0
        self._rich: Any = None
        self._tasks: dict[object, Any] = {}
        if not quiet and self.terminal:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._rich = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                  TimeElapsedColumn(), console=Console(file=self.stream, force_terminal=True),
                                  transient=True)
            self._rich.start()
            self._overall = self._rich.add_task(title, total=None)

    def items(self, done: int, total: int) -> None:
        """`done` of `total` items finished (a finished item prints a plain line at once)."""
        finished = done > self.done
        self.done, self.total = done, total
        if self.quiet:
            return
        if self._rich is not None:
            self._rich.update(self._overall, completed=done, total=total, description=f"{self.title} {done}/{total}")
        elif finished:
            self._line(f"{done}/{total} done")

    def running(self, items: dict[object, tuple[float, str]]) -> None:
        """The items running now: key -> (fraction done, description)."""
        if self.quiet:
            return
        if self._rich is None:
            now = time.monotonic()
            if items and now - self.last_plain >= PLAIN_EVERY_S:
                for _, text in items.values():
                    self._line(f"{self.done}/{self.total} done; {text}")
            return
        for key in [k for k in self._tasks if k not in items]:
            self._rich.remove_task(self._tasks.pop(key))
        for key, (fraction, text) in items.items():
            if key not in self._tasks:
                self._tasks[key] = self._rich.add_task(text, total=1.0)
            self._rich.update(self._tasks[key], completed=fraction, description=text)

    def _line(self, text: str) -> None:
        self.last_plain = time.monotonic()
        print(f"[{self.title}] {text}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None

    def __enter__(self) -> ProgressView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def shown_rows(title: str, quiet: bool, jobs: int | None, cluster: str | None) -> Callable[..., list[Any]]:
    """`fabriclab.compare.compare` with the command's jobs and cluster, its progress shown under `title`, and
    SIGTERM ending it as Ctrl-C does (its Ray tasks are cancelled and a local Ray instance it started shut down:
    `fabriclab.sweep.Session`). Called with compare's own arguments."""
    from fabriclab import compare as cmp

    def run(*args: Any, **kwargs: Any) -> list[Any]:
        with ProgressView(title, quiet=quiet) as view:
            def shown(p: Any) -> None:
                view.items(p.rows_done, p.rows)
                view.running({r.label: (r.bytes_share, r.describe()) for r in p.running})

            main = threading.current_thread() is threading.main_thread()
            previous = signal.signal(signal.SIGTERM, interrupted) if main else None
            try:
                return cmp.compare(*args, **kwargs, jobs=jobs, cluster=cluster, progress=shown)
            finally:
                if main:
                    signal.signal(signal.SIGTERM, previous)

    return run
