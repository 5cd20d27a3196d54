"""Independent tasks of a sweep (the rows of `fabriclab compare`, of the planner) on Ray.

    with Session(cluster=None, cpus=2) as s:          # None: a local Ray instance of `cpus` CPUs, ended with
        big = s.share(workload)                        # the session; "ray://HOST:PORT" (or RAY_ADDRESS): a cluster
        failed = s.run(fn, {0: (task0, big), 1: (task1, big)}, on_progress=..., on_done=...)

Each call is one Ray task running `fn(tell, *args)` on some worker of the cluster: large arguments go
through the object store once (`share`: `ray.put`), results stream back as they finish (`ray.wait`), and
`tell(message)` in a task relays progress to the driver through a small actor (`on_progress(key, message,
Where)`, with the worker's PID and node). A task whose worker process dies (killed, out of memory, its node
lost) is run once more (`max_retries=1`, set here: Ray's default is 3) and reported failed if that dies too;
an exception raised by `fn` is deterministic, so it is reported failed at once (`retry_exceptions=False`).
A failed task never ends the others: `run` returns the failures after every task has finished.

Ended in any way (Ctrl-C, SIGTERM as KeyboardInterrupt, an error in a callback), the session cancels the
tasks still pending or running (`ray.cancel(force=True)`) and shuts down the local instance it started (its
GCS, raylet and workers end with it), or disconnects from the cluster.

A cluster runs this checkout's code: the session ships the project's packages with the job
(`runtime_env` `py_modules`), so its nodes need fabriclab's dependencies (numpy, numba, ...), not fabriclab.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from fabric.errors import FabriclabError

#: the environment variable Ray reads for a cluster's address (as `ray.init` does)
ADDRESS_ENV = "RAY_ADDRESS"
#: how often a worker process may die under one task before it is reported failed: 1 retry
MAX_RETRIES = 1
#: how often the driver looks at the tasks' progress and results (seconds)
POLL_S = 0.2
#: how long the end of a session waits for a local instance's processes to exit (seconds)
SHUTDOWN_S = 10.0
#: the packages a cluster's job ships (its nodes run this checkout's code)
PACKAGES = ("fabric", "traffic", "controller", "fabriclab")
ROOT = Path(__file__).resolve().parents[1]


class SweepError(FabriclabError):
    """Ray cannot be started or the cluster cannot be reached; the message names the address."""


@dataclass(frozen=True)
class Where:
    """The worker process a message came from."""

    pid: int
    node: str  # the node's IP address
    node_id: str  # Ray's id of the node (nodes of one machine share its address)


@dataclass(frozen=True)
class Failure:
    """A task that failed: raised an exception (`kind` "error", not retried) or lost its worker process
    twice ("worker died": the first loss retried once)."""

    key: int
    kind: str
    message: str


def add_cluster_argument(parser: argparse.ArgumentParser) -> None:
    """`--cluster ADDRESS` on a subcommand whose tasks run through a `Session` (compare, the planner)."""
    parser.add_argument("--cluster", metavar="ADDRESS", default=None,
                        help="run the rows on a Ray cluster (ray://HOST:PORT for Ray Client, or HOST:PORT of its GCS "
                             f"from one of its nodes); default: ${ADDRESS_ENV} if set, else a local Ray instance "
                             "started for the command and ended with it (docs/simulator.md#on-a-cluster)")


def cluster_address(cluster: str | None) -> str | None:
    """The cluster to use: `cluster`, else $RAY_ADDRESS, else None (a local instance)."""
    return cluster or os.environ.get(ADDRESS_ENV) or None


class _Messages:
    """The progress relay, a Ray actor: tasks `tell` (fire and forget, so that a task never waits in
    `ray.get`, which would lend its CPU to another worker process started for it), the driver `take`s."""

    def __init__(self) -> None:
        self.messages: list[tuple[int, Any, Where]] = []

    def tell(self, message: tuple[int, Any, Where]) -> None:
        self.messages.append(message)

    def take(self) -> list[tuple[int, Any, Where]]:
        out, self.messages = self.messages, []
        return out


def _call(fn: Callable[..., Any], key: int, relay: Any, *args: Any) -> Any:
    """A task's body on its worker: `fn(tell, *args)`, `tell` sending (key, message, Where) to the relay."""
    import ray

    where = Where(os.getpid(), ray.util.get_node_ip_address(), ray.get_runtime_context().get_node_id())

    def tell(message: Any) -> None:
        relay.tell.remote((key, message, where))

    return fn(tell, *args)


def _descendants(pid: int) -> list[int]:
    """The live processes descended from `pid`."""
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _alive(pids: set[int]) -> bool:
    """Whether any of `pids` still runs (a zombie does not)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            continue
    return False


def _failure(key: int, err: Exception) -> Failure:
    """What `ray.get` raised for task `key`, as a failure: the task's own exception (raised once, not retried),
    or its worker process lost on both attempts."""
    import ray.exceptions as rex

    if isinstance(err, rex.RayTaskError):
        cause = err.cause
        return Failure(key, "error", f"{type(cause).__name__}: {cause}")
    if isinstance(err, (rex.WorkerCrashedError, rex.NodeDiedError, rex.LocalRayletDiedError, rex.OutOfMemoryError)):
        return Failure(key, "worker died", f"its worker process died on all {MAX_RETRIES + 1} attempts: {err}")
    return Failure(key, "error", f"{type(err).__name__}: {err}")


#: connection attempts when a Ray Client server dies as it starts (`_client_server_died`)
CLIENT_INIT_ATTEMPTS = 3


def _client_server_died(err: Exception) -> bool:
    """A Ray Client connection refused because the cluster's per-client server died as the proxier started it:
    ray-project/ray#63202 (open in Ray 2.60: the proxier forks it from a process with gRPC threads, and it
    dies in a few percent of connections; seen once in this project's CI campaigns). A new
    connection gets a new server, so this one is worth another attempt; nothing else is retried."""
    return isinstance(err, ConnectionAbortedError) and "Initialization failure from server" in str(err)


def _reset_ray() -> None:
    """Undo what a failed `ray.init` left: its half-made connection, and Ray Client mode."""
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()
    with contextlib.suppress(Exception):
        from ray.util.client import ray as client

        client.disconnect()  # turns client mode off when no client context is left


class Session:
    """A connection to Ray for one sweep or more (module docstring): `cluster` an address (None: $RAY_ADDRESS,
    else a new local instance of `cpus` CPUs, default the machine's). If this process is connected already
    (`ray.init` called by its caller), that connection is used and left open."""

    def __init__(self, cluster: str | None = None, cpus: int | None = None) -> None:
        self.address = cluster_address(cluster)
        self.cpus = cpus
        self.owned = False
        self.local = self.address is None
        self.temp_dir: str | None = None
        self.children_before: set[int] = set()

    def __enter__(self) -> Session:
        import ray

        if ray.is_initialized():
            self.local = False
            return self
        main = threading.current_thread() is threading.main_thread()
        previous = signal.getsignal(signal.SIGTERM) if main else None
        self.children_before = set(_descendants(os.getpid()))
        kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
        if self.local:
            # its session files (logs, sockets) in a directory of its own, removed with it: nothing left in /tmp/ray
            self.temp_dir = tempfile.mkdtemp(prefix="fabriclab-ray-")
            kwargs |= {"address": "local", "num_cpus": self.cpus or os.cpu_count() or 1, "include_dashboard": False,
                       "_temp_dir": self.temp_dir}
        else:
            kwargs |= {"address": self.address,
                       "runtime_env": {"py_modules": [str(ROOT / p) for p in PACKAGES],
                                       "excludes": ["__pycache__", "*.pyc"]}}
        try:
            self._init(kwargs)
        except SweepError:
            self._remove_temp_dir()
            raise
        finally:
            # ray.init replaces the SIGTERM handler with one that exits at once; the caller's (the CLI's:
            # SIGTERM as Ctrl-C) stays, so that the tasks are cancelled and the instance shut down
            if main and previous is not None:
                signal.signal(signal.SIGTERM, previous)
        self.owned = True
        return self

    def _init(self, kwargs: dict[str, Any]) -> None:
        """`ray.init(**kwargs)`, a Ray Client server's death at start (`_client_server_died`) tried again; a
        failed attempt undone (`_reset_ray`), the last one raised as a SweepError naming the address."""
        import ray

        for attempt in range(1, CLIENT_INIT_ATTEMPTS + 1):
            try:
                ray.init(**kwargs)
                return
            except Exception as e:  # Ray raises ConnectionError, RuntimeError, ValueError, its own errors
                # a failed init leaves Ray half set up (after a failed Ray Client connection, client mode
                # stays on and the next ray.init in this process fails on an assertion): undo it
                _reset_ray()
                if attempt == CLIENT_INIT_ATTEMPTS or not _client_server_died(e):
                    where = f"the Ray cluster at {self.address}" if self.address else "a local Ray instance"
                    tries = f" ({attempt} attempts)" if attempt > 1 else ""
                    raise SweepError(f"cannot start or reach {where}{tries}: {type(e).__name__}: {e}") from None

    def __exit__(self, *exc: object) -> None:
        if self.owned:
            import ray

            started = set(_descendants(os.getpid())) - self.children_before
            ray.shutdown()
            self.owned = False
            # ray.shutdown returns before every process of a local instance has exited (its dashboard process
            # writes its logs for a second more): wait for them, so that the session files can go
            end = time.monotonic() + SHUTDOWN_S
            while _alive(started) and time.monotonic() < end:
                time.sleep(0.05)
        self._remove_temp_dir()

    def _remove_temp_dir(self) -> None:
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None

    def share(self, obj: Any) -> Any:
        """`obj` in the object store, once: pass the reference to `run` as an argument, every task reads it."""
        import ray

        return ray.put(obj)

    def run(self, fn: Callable[..., Any], calls: Mapping[int, tuple[Any, ...]], *, limit: int | None = None,
            on_progress: Callable[[int, Any, Where], None] | None = None,
            on_done: Callable[[int, Any], None] | None = None,
            on_failed: Callable[[int, Failure], None] | None = None) -> list[Failure]:
        """`fn(tell, *args)` for every `key: args` of `calls` as a task, at most `limit` at once (default: as
        many as the cluster's CPUs take); `on_done(key, value)` as each finishes, `on_failed(key, failure)` as
        one fails, `on_progress(key, message, where)` as it tells. Returns the failed tasks, in key order."""
        import ray

        relay: Any = ray.remote(num_cpus=0)(_Messages).remote()
        remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_call)
        waiting = sorted(calls)
        pending: dict[Any, int] = {}
        failed: list[Failure] = []
        try:
            while waiting or pending:
                while waiting and (limit is None or len(pending) < limit):
                    key = waiting.pop(0)
                    pending[remote.remote(fn, key, relay, *calls[key])] = key
                done, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
                if done:  # and whatever else is ready, without waiting again
                    done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
                running = set(pending.values())
                for key, message, where in ray.get(relay.take.remote()):
                    if key in running and on_progress is not None:
                        on_progress(key, message, where)
                for ref in done:
                    key = pending.pop(ref)
                    try:
                        value = ray.get(ref)
                    except ray.exceptions.RayError as e:
                        failed.append(_failure(key, e))
                        if on_failed is not None:
                            on_failed(key, failed[-1])
                        continue
                    if on_done is not None:
                        on_done(key, value)
        finally:
            for ref in pending:  # stopped early: nothing runs on after the command
                ray.cancel(ref, force=True)
            ray.kill(relay)
        return sorted(failed, key=lambda f: f.key)
