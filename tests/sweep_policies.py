"""Routing policies that misbehave on a Ray worker, for the sweep tests (tests/test_compare_ray.py): imported by
the workers of the test's cluster, whose nodes it starts with `TEST_DIR_ENV` naming a directory where the
policies leave what they did. Without that variable (the single-process reference run) they are ECMP.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from fabric.routing.modes import EcmpPolicy

TEST_DIR_ENV = "FABRICLAB_SWEEP_TEST_DIR"
#: how long a stalled worker waits to be killed before it gives up (and fails its row, so the test fails)
STALL_DEADLINE_S = 300.0


def _test_dir() -> Path | None:
    d = os.environ.get(TEST_DIR_ENV)
    return Path(d) if d else None


class StallsOnce(EcmpPolicy):
    """ECMP; the first worker to build it writes its PID to `stalled` in the test directory and waits there to
    be killed (its row is mid-run when the test kills it); every later build (the retry) runs as ECMP. Every
    build notes its PID in `built`."""

    name = "stalls-once"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        d = _test_dir()
        if d is None:
            return
        with (d / "built").open("a") as f:
            f.write(f"{os.getpid()}\n")
        try:
            fd = os.open(d / "stalled", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        end = time.monotonic() + STALL_DEADLINE_S
        while time.monotonic() < end:
            time.sleep(0.1)
        raise RuntimeError(f"worker {os.getpid()} stalled {STALL_DEADLINE_S} s and was never killed")


class DiesAlways(EcmpPolicy):
    """Kills its own worker process each time it is built, after noting the PID in `died`."""

    name = "dies-always"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        d = _test_dir()
        if d is not None:
            with (d / "died").open("a") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)


class RaisesAlways(EcmpPolicy):
    """Raises each time it is built (a deterministic error in the row), after noting the PID in `raised`."""

    name = "raises-always"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        d = _test_dir()
        if d is not None:
            with (d / "raised").open("a") as f:
                f.write(f"{os.getpid()}\n")
            raise RuntimeError("this row's routing always raises")
