"""iperf3 flows between emulated hosts (any `fabric.emulation.hosts.Hosts`).

    run = start_iperf(hosts, "h0", "h15", plane="A", seconds=5, cport=49152)
    res = run.result()
    res.steady_mbps     # median of the per-interval rates after the warm-up: what the link carries

Throughput is judged from the steady part of a flow: the median of per-interval rates after
`warmup_s`, not the whole-run average that a slow start or one datapath stall drags down.
"""
from __future__ import annotations

import json
import statistics
import subprocess
from dataclasses import dataclass
from typing import Any

from fabric.emulation.hosts import Hosts
from fabric.errors import EmulationError
from fabric.polling import wait_until


@dataclass(frozen=True)
class IperfResult:
    mbps: float  # received, over the whole run (after the omitted start)
    intervals: tuple[tuple[float, float], ...]  # (end time s, Mbit/s) per reporting interval
    warmup_s: float
    received_bytes: int = 0  # payload the receiver got over the whole run (after the omitted start)

    @property
    def steady(self) -> list[float]:
        """The per-interval rates (Mbit/s) of the intervals that end after the warm-up."""
        steady = [mbps for end, mbps in self.intervals if end > self.warmup_s]
        if not steady:
            raise EmulationError(f"no iperf3 interval ends after the {self.warmup_s:g} s warm-up")
        return steady

    @property
    def steady_mbps(self) -> float:
        """Median of the per-interval rates that end after the warm-up."""
        return float(statistics.median(self.steady))

    @property
    def best_mbps(self) -> float:
        """The highest per-interval rate after the warm-up: what the path carries when the emulator
        keeps up (its stalls only ever take from a flow, so they lower the median, not this)."""
        return max(self.steady)


def parse_iperf_json(text: str, label: str, warmup_s: float) -> IperfResult:
    try:
        data = json.loads(text[text.index("{"):])
        end = data["end"]
        total = end.get("sum_received") or end["sum"]
        # per-interval rates as the receiver counted them (`--get-server-output`: bytes delivered, not
        # writes accepted into the sender's growing buffer), else as the sender did
        server = data.get("server_output_json")
        source = server["intervals"] if isinstance(server, dict) and server.get("intervals") else data["intervals"]
        intervals = tuple((float(i["sum"]["end"]), float(i["sum"]["bits_per_second"]) / 1e6)
                          for i in source if not i["sum"].get("omitted"))
        return IperfResult(float(total["bits_per_second"]) / 1e6, intervals, warmup_s, int(total.get("bytes", 0)))
    except (ValueError, KeyError, TypeError) as e:
        raise EmulationError(f"iperf3 {label} gave no result: {text.strip()[-300:]}") from e


class IperfRun:
    def __init__(self, label: str, client: subprocess.Popen[Any], server: subprocess.Popen[Any],
                 warmup_s: float) -> None:
        self.label, self.client, self.server, self.warmup_s = label, client, server, warmup_s

    def result(self, timeout_s: float = 120.0) -> IperfResult:
        try:
            out, _ = self.client.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise EmulationError(f"iperf3 {self.label} did not finish within {timeout_s:g} s") from None
        finally:
            if self.server.poll() is None:
                self.server.terminate()
            self.server.wait(timeout=5)
        text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
        return parse_iperf_json(text, self.label, self.warmup_s)

    def stop(self) -> None:
        for p in (self.client, self.server):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=5)


def start_iperf(hosts: Hosts, src: str, dst: str, plane: str, seconds: float, *, omit_s: float = 0.0,
                cport: int | None = None, port: int = 5201, udp_mbps: float | None = None,
                warmup_s: float = 1.0, interval_s: float = 0.5, write_bytes: int | None = None) -> IperfRun:
    """Start one iperf3 flow src -> dst over `plane` (TCP, or UDP at `udp_mbps`), from client port
    `cport` if given (which fixes its ECMP path). The server is up (polled) before the client starts.
    The client's per-interval rates count whole writes (`write_bytes`, iperf3's `-l`; its default
    128 KiB): at a few Mbit/s a half-second interval is a handful of writes, so set it smaller there."""
    fab = hosts.fabric
    s_ip, d_ip = str(fab.nic(src, plane).ip), str(fab.nic(dst, plane).ip)
    server = hosts.popen(dst, ["iperf3", "-s", "-1", "-B", d_ip, "-p", str(port)])

    def listening() -> bool:
        if server.poll() is not None:
            raise EmulationError(f"iperf3 server on {dst}:{port} exited with code {server.returncode}")
        return f":{port}" in hosts.run(dst, ["ss", "-ltnH", f"sport = :{port}"]).stdout

    try:
        wait_until(f"the iperf3 server on {dst}:{port}", listening, 10.0)
    except BaseException:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=5)
        raise
    cmd = ["iperf3", "-c", d_ip, "-B", s_ip, "-p", str(port), "-t", f"{seconds:g}", "-O", f"{omit_s:g}", "-J",
           "-i", f"{interval_s:g}", "--get-server-output"]
    if cport is not None:
        cmd += ["--cport", str(cport)]
    if write_bytes is not None:
        cmd += ["-l", str(int(write_bytes))]
    if udp_mbps is not None:
        cmd += ["-u", "-b", f"{udp_mbps:g}M"]
    client = hosts.popen(src, cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    return IperfRun(f"{src} -> {dst}", client, server, warmup_s)


def iperf(hosts: Hosts, src: str, dst: str, plane: str, seconds: float = 5.0, **kwargs: Any) -> IperfResult:
    """One TCP flow src -> dst over `plane`, run to completion."""
    return start_iperf(hosts, src, dst, plane, seconds, **kwargs).result()
