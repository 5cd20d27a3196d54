"""Run the paced probe (`traffic.probe`) between two emulated hosts and attribute its loss to events.

    run = ProbeRun(hosts, "h0", "h15", plane="A", sport=49152, rate_pps=4000, seconds=6, workdir=d).start()
    t0 = run.wait_sending()          # the sender is really sending (polled to a deadline)
    ev = faults.link_down("spineA0", 4)
    report = run.result()
    report.lost_in(ev.at_s - 0.005, ev.at_s + 0.5)      # loss due to the failure
    report.lost_outside([(ev.at_s - 0.005, ev.at_s + 0.5)])   # background loss, bounded separately

Works on anything that implements `fabric.emulation.hosts.Hosts`. Readiness is polled to deadlines:
the receiver writes a file once its socket is bound, the sender once its schedule starts.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fabric.emulation.hosts import Hosts
from fabric.errors import EmulationError
from fabric.polling import wait_until

Window = tuple[float, float]  # (from, to), monotonic seconds


@dataclass(frozen=True)
class ProbeReport:
    src: str
    dst: str
    t0_s: float  # monotonic time packet 0 was due
    rate_pps: float
    expected: int  # packets sent (scheduled); 0 if the receiver saw no end marker
    received: int
    duplicates: int
    lost_spans: tuple[tuple[int, int], ...]
    send_errors: tuple[int, ...]  # refused by the sender's own kernel (never reached the fabric)
    late_max_ms: float
    latency_ms: dict[str, float]
    sent_per_route: tuple[int, ...] = ()  # per plane of the run (ProbeRun.planes), packets that left by it
    rerouted: int = 0  # packets that left by another plane because theirs refused them

    @property
    def lost(self) -> int:
        return sum(b - a + 1 for a, b in self.lost_spans)

    @property
    def longest_span_ms(self) -> float:
        return max((b - a + 1 for a, b in self.lost_spans), default=0) / self.rate_pps * 1000

    @property
    def inflight_s(self) -> float:
        """The longest one-way latency a delivered packet had: packets sent up to this long before an
        event may still have been queued on the path when it happened (a link going down drops its
        queue), so an event's window starts this much before it (at least 5 ms)."""
        return max(0.005, self.latency_ms.get("max", 0.0) / 1000)

    def window(self, at_s: float, after_s: float) -> Window:
        """The window of an event at `at_s`: from one in-flight time before it to `after_s` after it."""
        return (at_s - self.inflight_s, at_s + after_s)

    def due_s(self, seq: int) -> float:
        """Monotonic time sequence number `seq` was due to be sent."""
        return self.t0_s + seq / self.rate_pps

    def _seq_range(self, window: Window) -> tuple[int, int]:
        """[first, last] sequence numbers due inside the window (empty if first > last); a packet due
        within a nanosecond of an edge counts as inside (float rounding)."""
        a, b = window
        eps = 1e-9 * self.rate_pps
        first = max(0, math.ceil((a - self.t0_s) * self.rate_pps - eps))
        last = math.floor((b - self.t0_s) * self.rate_pps + eps)
        return first, last

    def lost_in(self, start_s: float, end_s: float) -> int:
        """Packets due in [start_s, end_s] that were lost."""
        first, last = self._seq_range((start_s, end_s))
        return sum(max(0, min(b, last) - max(a, first) + 1) for a, b in self.lost_spans)

    def spans_in(self, start_s: float, end_s: float) -> list[tuple[int, int]]:
        first, last = self._seq_range((start_s, end_s))
        return [(max(a, first), min(b, last)) for a, b in self.lost_spans if a <= last and b >= first]

    def lost_outside(self, windows: list[Window]) -> int:
        """Packets lost that were due outside every window: the background."""
        return self.lost - self._lost_in_union(windows)

    def _lost_in_union(self, windows: list[Window]) -> int:
        ranges = sorted(self._seq_range(w) for w in windows)
        merged: list[list[int]] = []
        for a, b in ranges:
            if a > b:
                continue
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        total = 0
        for a, b in merged:
            total += sum(max(0, min(y, b) - max(x, a) + 1) for x, y in self.lost_spans)
        return total

    def first_loss_s(self) -> float | None:
        return self.due_s(self.lost_spans[0][0]) if self.lost_spans else None

    def summary(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "rate_pps": self.rate_pps, "expected": self.expected,
                "received": self.received, "lost": self.lost, "lost_spans": [list(s) for s in self.lost_spans],
                "send_errors": len(self.send_errors), "late_max_ms": round(self.late_max_ms, 3),
                "latency_ms": self.latency_ms}


class ProbeRun:
    """One probe sender and receiver in two emulated hosts (processes we started, ended by PID)."""

    def __init__(self, hosts: Hosts, src: str, dst: str, *, plane: str, sport: int, rate_pps: float,
                 seconds: float, workdir: Path, port: int = 9000, idle_s: float = 3.0) -> None:
        fab = hosts.fabric
        self.hosts = hosts
        self.src, self.dst = src, dst
        # plane "both": every plane the two hosts share, packet seq on plane seq mod k (traffic.probe)
        shared = [n.plane for n in fab.nics_of[src] if any(m.plane == n.plane for m in fab.nics_of[dst])]
        self.planes = tuple(shared) if plane == "both" else (plane,)
        if not self.planes:
            raise EmulationError(f"hosts {src} and {dst} share no plane")
        self.src_ips = [str(fab.nic(src, p).ip) for p in self.planes]
        self.dst_ips = [str(fab.nic(dst, p).ip) for p in self.planes]
        self.src_ip, self.dst_ip = self.src_ips[0], self.dst_ips[0]
        self.sport, self.port = sport, port
        self.rate_pps, self.seconds, self.idle_s = rate_pps, seconds, idle_s
        tag = f"probe-{src}-{dst}-{plane}-{sport}-{port}"
        self.files = {k: workdir / f"{tag}.{k}" for k in ("ready", "start", "recv.json", "send.json", "log")}
        for f in self.files.values():
            f.unlink(missing_ok=True)
        self.recv: subprocess.Popen[Any] | None = None
        self.send: subprocess.Popen[Any] | None = None
        self.t0_s: float | None = None

    def start(self, timeout_s: float = 20.0) -> "ProbeRun":
        """Start the receiver, wait until it is bound, then start the sender."""
        log = open(self.files["log"], "ab")
        try:
            self.recv = self.hosts.popen(self.dst, [
                sys.executable, "-m", "traffic.probe", "recv", "--bind",
                self.dst_ip if len(self.planes) == 1 else "0.0.0.0", "--port", str(self.port),
                "--idle-s", str(self.idle_s), "--ready-file", str(self.files["ready"]),
                "--out", str(self.files["recv.json"])], stdout=log, stderr=log)
            recv = self.recv
            wait_until(f"the probe receiver on {self.dst} to bind {self.dst_ip}:{self.port}",
                       lambda: self.files["ready"].exists() or recv.poll() is not None, timeout_s)
            if recv.poll() is not None:
                raise EmulationError(f"the probe receiver on {self.dst} exited ({recv.returncode}): {self._log()}")
            pairs = zip(self.src_ips, self.dst_ips) if len(self.planes) > 1 else [(self.src_ip, self.dst_ip)]
            routes = [a for s_ip, d_ip in pairs for a in ("--bind", s_ip, "--dst", d_ip)]
            self.send = self.hosts.popen(self.src, [
                sys.executable, "-m", "traffic.probe", "send", *routes, "--port", str(self.port),
                "--sport", str(self.sport), "--rate-pps", f"{self.rate_pps:g}",
                "--seconds", f"{self.seconds:g}", "--start-file", str(self.files["start"]),
                "--out", str(self.files["send.json"])], stdout=log, stderr=log)
        except BaseException:
            self.stop()
            raise
        finally:
            log.close()
        return self

    def wait_sending(self, timeout_s: float = 20.0) -> float:
        """Wait until the sender has started its schedule; returns its t0 (monotonic seconds)."""
        if self.t0_s is None:
            send = self.send
            if send is None:
                raise EmulationError("the probe was not started")
            wait_until(f"the probe sender on {self.src} to start",
                       lambda: self.files["start"].exists() or send.poll() is not None, timeout_s, 0.01)
            text = self.files["start"].read_text() if self.files["start"].exists() else ""
            if not text:
                raise EmulationError(f"the probe sender on {self.src} exited ({send.returncode}): {self._log()}")
            self.t0_s = float(text)
        return self.t0_s

    def result(self, timeout_s: float | None = None) -> ProbeReport:
        """Wait for both ends (to a deadline) and read their results."""
        if self.send is None or self.recv is None:
            raise EmulationError("the probe was not started")
        limit = timeout_s if timeout_s is not None else self.seconds + self.idle_s + 30
        try:
            self.send.wait(timeout=limit)
            self.recv.wait(timeout=self.idle_s + 30)
        except subprocess.TimeoutExpired:
            self.stop()
            raise EmulationError(f"probe {self.src} -> {self.dst} did not finish within {limit:g} s") from None
        if self.send.returncode != 0 or self.recv.returncode != 0:
            raise EmulationError(f"probe {self.src} -> {self.dst} failed (sender {self.send.returncode}, "
                                 f"receiver {self.recv.returncode}): {self._log()}")
        s = json.loads(self.files["send.json"].read_text())
        r = json.loads(self.files["recv.json"].read_text())
        spans = tuple((int(a), int(b)) for a, b in r["lost_spans"])
        return ProbeReport(self.src, self.dst, s["t0_s"], s["rate_pps"], r["expected"], r["received"],
                           r["duplicates"], spans, tuple(s["send_errors"]), s["late_max_ms"], r["latency_ms"],
                           tuple(s.get("sent_per_route", ())), int(s.get("rerouted", 0)))

    def stop(self) -> None:
        """End both processes (by their handles) if they still run."""
        for p in (self.send, self.recv):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=5)

    def _log(self) -> str:
        try:
            return self.files["log"].read_text(errors="replace")[-500:]
        except OSError:
            return ""
