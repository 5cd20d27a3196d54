"""The replay driver: starts one agent per host, issues the collectives, gathers their timings.

It runs beside the emulation (root namespace) and talks to the agents over a Unix socket in the run
directory. Calls are issued as soon as the calls they depend on have ended (`ReplayPlan.calls`);
each call's start is when the driver sent its start, its end when its last transfer was received
(the agents' CLOCK_MONOTONIC, the same clock as the driver's). A call whose collective is all in-server
(`Template.local_us`) involves no agent: the driver holds it `count x local_us x dilation` (its emulated
NVLink time) and ends it then; for the in-server transfers of a mixed one it passes each sender's word
on to the receiver (`{"nvlink": ...}`, `traffic.replay.agent`). While the replay runs, a thread samples
the switches' port counters (a callable handed in, e.g. the controller's REST API) for per-link
utilisation over time, and /proc/stat for how busy the machine was.

Failure handling: an agent that exits, a call that does not complete by its deadline, or SIGINT /
SIGTERM (raised as KeyboardInterrupt by the caller's handler) stops every agent (by its handle) and
raises, naming the host or the call.
"""
from __future__ import annotations

import json
import selectors
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from fabric.emulation.hosts import Hosts
from traffic.replay.place import PlacedPlan
from traffic.replay.plan import ReplayError
from traffic.replay.timings import CallTimes, RunTimings

Counters = dict[tuple[str, int], int]  # (switch, port) -> tx bytes


@dataclass
class CallTiming:
    call: int
    start_s: float  # monotonic, when the driver sent the start
    end_s: float = 0.0  # monotonic, the last transfer received
    hosts_done: set[str] = field(default_factory=set)
    received_s: dict[int, float] = field(default_factory=dict)  # transfer -> when its last byte arrived


@dataclass
class RawRun:
    timings: list[CallTiming]
    samples: list[tuple[float, Counters]]  # (monotonic time, counters)
    cpu_idle_share: float
    started_s: float
    ended_s: float
    started_wall: float

    def run_timings(self) -> RunTimings:
        """The calls' times in neither backend's terms."""
        return RunTimings(tuple(CallTimes(t.call, t.start_s, t.end_s) for t in self.timings), self.started_s,
                          self.ended_s, self.started_wall)


def cpu_times() -> tuple[float, float]:
    """(idle, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [float(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return idle, sum(fields)


class _Peer:
    def __init__(self, host: str, sock: socket.socket) -> None:
        self.host, self.sock, self.buf = host, sock, b""

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall((json.dumps(msg) + "\n").encode())


class Driver:
    def __init__(self, placed: PlacedPlan, hosts: Hosts, run_dir: Path,
                 sample_counters: Callable[[], Counters] | None = None, link_interval_s: float = 0.5,
                 on_call_done: Callable[[int, int, int], None] | None = None, setup_timeout_s: float = 60.0) -> None:
        self.placed = placed
        self.plan = placed.plan
        self.hosts = hosts
        self.run_dir = run_dir
        self.sample_counters = sample_counters
        self.link_interval_s = link_interval_s
        self.on_call_done = on_call_done
        self.setup_timeout_s = setup_timeout_s
        self.procs: dict[str, subprocess.Popen[Any]] = {}
        self.peers: dict[str, _Peer] = {}
        self.sel = selectors.DefaultSelector()
        self._stop_sampling = threading.Event()
        self.samples: list[tuple[float, Counters]] = []
        self.sampler_error: BaseException | None = None

    # ---- agents ----------------------------------------------------------------------------------
    def _start_agents(self) -> socket.socket:
        path = self.run_dir / "control.sock"
        path.unlink(missing_ok=True)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        server.listen(1024)
        server.settimeout(0.2)
        for host in self.plan.hosts():
            log = open(self.run_dir / f"agent-{host}.log", "wb")
            try:
                self.procs[host] = self.hosts.popen(host, [sys.executable, "-m", "traffic.replay.agent", "--control",
                                                           str(path), "--host", host], stdout=log, stderr=log)
            finally:
                log.close()
        deadline = time.monotonic() + self.setup_timeout_s
        pending: list[socket.socket] = []
        while len(self.peers) < len(self.procs):
            self._check_agents()
            if time.monotonic() > deadline:
                missing = sorted(set(self.procs) - set(self.peers))
                raise ReplayError(f"replay agents on {missing[:5]} did not say hello within {self.setup_timeout_s:g} s")
            try:
                conn, _ = server.accept()
                conn.settimeout(None)
                pending.append(conn)
            except socket.timeout:
                pass
            for conn in list(pending):
                conn.settimeout(0.05)
                try:
                    line = conn.recv(4096)
                except socket.timeout:
                    continue
                conn.settimeout(None)
                pending.remove(conn)
                msg = json.loads(line.split(b"\n", 1)[0])
                peer = _Peer(msg["hello"], conn)
                peer.buf = line.split(b"\n", 1)[1]
                self.peers[peer.host] = peer
                conn.setblocking(False)
                self.sel.register(conn, selectors.EVENT_READ, peer)
        return server

    def _check_agents(self) -> None:
        for host, proc in self.procs.items():
            if proc.poll() is not None:
                raise ReplayError(f"the replay agent on {host} exited with code {proc.returncode}: "
                                  f"{self._log(host)}")

    def _log(self, host: str) -> str:
        try:
            return (self.run_dir / f"agent-{host}.log").read_text(errors="replace").strip()[-600:]
        except OSError:
            return ""

    def _messages(self, timeout_s: float) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for key, _ in self.sel.select(timeout=timeout_s):
            peer: _Peer = key.data
            try:
                data = peer.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            if not data:
                self._check_agents()
                raise ReplayError(f"the replay agent on {peer.host} closed its control connection: "
                                  f"{self._log(peer.host)}")
            peer.buf += data
            while b"\n" in peer.buf:
                line, peer.buf = peer.buf.split(b"\n", 1)
                out.append((peer.host, json.loads(line)))
        return out

    def _gather(self, key: str, what: str) -> None:
        """Wait for `key` from every agent."""
        have: set[str] = set()
        deadline = time.monotonic() + self.setup_timeout_s
        while len(have) < len(self.peers):
            self._check_agents()
            if time.monotonic() > deadline:
                raise ReplayError(f"replay agents on {sorted(set(self.peers) - have)[:5]} not {what} within "
                                  f"{self.setup_timeout_s:g} s")
            for host, msg in self._messages(0.1):
                if key in msg:
                    have.add(host)

    # ---- sampling --------------------------------------------------------------------------------
    def _sample_loop(self) -> None:
        try:
            while not self._stop_sampling.is_set():
                if self.sample_counters is not None:
                    t = time.monotonic()
                    self.samples.append((t, self.sample_counters()))
                self._stop_sampling.wait(self.link_interval_s)
        except BaseException as e:  # noqa: BLE001 - re-raised by run()
            self.sampler_error = e

    # ---- the run ---------------------------------------------------------------------------------
    def run(self) -> RawRun:
        server = self._start_agents()
        sampler = threading.Thread(target=self._sample_loop, name="fabriclab-replay-sampler", daemon=True)
        try:
            for host, peer in self.peers.items():
                peer.send({"setup": self.placed.agent_plan(host)})
            self._gather("listening", "listening")
            for peer in self.peers.values():
                peer.send({"connect": True})
            self._gather("ready", "connected")
            sampler.start()
            idle0, total0 = cpu_times()
            started_wall, started = time.time(), time.monotonic()
            timings = self._issue_all()
            ended = time.monotonic()
            idle1, total1 = cpu_times()
            return RawRun(timings, self.samples, (idle1 - idle0) / max(1.0, total1 - total0), started, ended,
                          started_wall)
        finally:
            self._stop_sampling.set()
            if sampler.is_alive():
                sampler.join(timeout=10)
            self.stop()
            server.close()

    def _issue_all(self) -> list[CallTiming]:
        plan = self.plan
        placed = {p.template.id: p for p in self.placed.placed}
        involved = {tid: p.hosts() for tid, p in placed.items()}
        pending_deps = {c.id: set(c.deps) for c in plan.calls}
        dependents: dict[int, list[int]] = {c.id: [] for c in plan.calls}
        for c in plan.calls:
            for d in c.deps:
                dependents[d].append(c.id)
        timings: dict[int, CallTiming] = {}
        ends: dict[int, list[float]] = {}  # receive completions
        reports: dict[int, list[float]] = {}  # for calls in which nothing is received over the network
        ready = [c.id for c in plan.calls if not c.deps]
        done = 0
        host_bps = {h: plan.host_emu_bps(h) for h in plan.hosts()}
        held: dict[int, float] = {}  # all in-server calls running: call -> when it ends

        def ended(cid: int) -> None:
            nonlocal done
            done += 1
            if self.on_call_done is not None:
                self.on_call_done(done, len(plan.calls), cid)
            for nxt in dependents[cid]:
                pending_deps[nxt].discard(cid)
                if not pending_deps[nxt]:
                    ready.append(nxt)

        while done < len(plan.calls):
            self._check_agents()
            if self.sampler_error is not None:
                raise ReplayError(f"sampling the switches' counters failed: {self.sampler_error}")
            for cid in ready:
                call = plan.calls[cid]
                t0 = time.monotonic()
                timings[cid] = CallTiming(cid, t0)
                ends[cid], reports[cid] = [], []
                local_us = plan.templates[call.template].local_us
                if local_us is not None:
                    held[cid] = t0 + local_us * call.count / 1e6 * plan.dilation
                    continue
                for host in sorted(involved[call.template]):
                    self.peers[host].send({"start": cid, "template": call.template})
            ready = []
            wait = min(0.05, max(0.0, min(held.values(), default=float("inf")) - time.monotonic()))
            for host, msg in self._messages(wait):
                if "nvlink" in msg:
                    self.peers[msg["to"]].send({k: msg[k] for k in ("nvlink", "template", "tid")})
                    continue
                if "done" not in msg:
                    continue
                cid = int(msg["done"])
                tm = timings[cid]
                tm.hosts_done.add(host)
                ends[cid].extend(t for _, t in msg["recv"])
                tm.received_s.update((int(x), t) for x, t in msg["recv"])
                reports[cid].append(msg["reported"])
                if tm.hosts_done >= involved[plan.calls[cid].template]:
                    tm.end_s = max(ends[cid]) if ends[cid] else max(reports[cid])
                    ended(cid)
            now = time.monotonic()
            for cid, end_s in sorted(held.items(), key=lambda kv: kv[1]):
                if end_s <= now:
                    del held[cid]
                    timings[cid].end_s = end_s
                    ended(cid)
            # a deadline per running call: 20x its bandwidth-bound estimate plus a minute
            now = time.monotonic()
            for cid, tm in timings.items():
                if tm.end_s:
                    continue
                p = placed[plan.calls[cid].template]
                t = p.template
                estimate = max((b * 8 / host_bps[h] for h, b in p.bytes_sent_by().items()), default=0.0)
                estimate += sum(x.nvlink_s for x in p.transfers)  # in-server transfers, one after another at worst
                if now - tm.start_s > 20 * estimate + 60:
                    missing = sorted(involved[t.id] - tm.hosts_done)
                    raise ReplayError(f"collective #{cid} ({t.kind}, {t.emu_bytes} emulated bytes) did not complete "
                                      f"within {20 * estimate + 60:.0f} s; waiting for {missing[:5]}; "
                                      f"agents say: {self._status(missing[:3])}")
        return [timings[c.id] for c in plan.calls]

    def _status(self, hosts: list[str]) -> str:
        """Ask some agents what they are waiting for (best effort, for error messages)."""
        for h in hosts:
            self.peers[h].send({"status": True})
        said: dict[str, Any] = {}
        deadline = time.monotonic() + 3
        while len(said) < len(hosts) and time.monotonic() < deadline:
            for host, msg in self._messages(0.1):
                if "status" in msg:
                    said[host] = msg["status"]
        return json.dumps(said)[:3000]

    def stop(self) -> None:
        """Tell the agents to stop, then end any still running (by handle)."""
        for peer in self.peers.values():
            try:
                peer.send({"stop": True})
            except OSError:
                pass
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for peer in self.peers.values():
            try:
                self.sel.unregister(peer.sock)
            except (KeyError, ValueError):
                pass
            peer.sock.close()
        self.peers.clear()
