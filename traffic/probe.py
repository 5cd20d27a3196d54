"""A paced UDP probe with sequence numbers, for measuring outages as lost-sequence spans.

    python -m traffic.probe recv --bind 198.18.0.16 --port 9000 --out recv.json --ready-file ready
    python -m traffic.probe send --dst 198.18.0.16 --port 9000 --sport 49152 --rate-pps 5000 --seconds 10 \
        --out send.json

The sender sends packet `seq` at `t0 + seq / rate` (an absolute schedule on CLOCK_MONOTONIC, with
1 ns timer slack, so a late wake-up is caught up, not accumulated) from a fixed source port (so its
ECMP path is fixed, see fabric.routing.entropy). Each packet carries its sequence number and its
send time. CLOCK_MONOTONIC is shared by every process of the machine, so the time a packet was
*due* can be compared with the time a fault was injected: loss is attributed to the window of the
event under test, and the rest is background.

With several routes (`--bind A --dst A' --bind B --dst B'`: one per plane, the host's NIC addresses
and the peer's), packet `seq` leaves by route `seq mod k`, as a collective library spreads over its
NICs. A route whose send fails (ENETUNREACH: the emulated hosts ignore routes whose NIC lost carrier,
see fabric.emulation.plan) is skipped for `ROUTE_RETRY_S` and the packet leaves by the next route at
once: a host whose plane died keeps sending on the other. A send error is counted only when every
route refused the packet.

The receiver (32 MB socket buffer, forced as root, so that a receiver stalled for tens of ms loses
nothing) records which sequence numbers arrived and their one-way latency, and writes its result
`END_GRACE_S` after the sender's end marker arrives (the last packets may come by a slower route),
after `--idle-s` without packets, or on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

HEADER = struct.Struct("!QQQ")  # sequence number, magic or end marker, send time (CLOCK_MONOTONIC ns)
MAGIC = 0xFAB1AB00
END = 0xFAB1ABFF
PAYLOAD_BYTES = 64
RCVBUF_BYTES = 32 << 20
PR_SET_TIMERSLACK = 29
ROUTE_RETRY_S = 0.02  # a route that refused a packet is tried again after this
END_GRACE_S = 0.2  # the receiver keeps listening this long after the end marker (routes differ in delay)
SO_RCVBUFFORCE = 33  # Linux; not exported by Python's socket module


@dataclass(frozen=True)
class SendResult:
    t0_s: float  # monotonic time packet 0 was due
    rate_pps: float
    sent: int  # packets handed to the kernel
    send_errors: tuple[int, ...]  # sequence numbers the kernel refused (e.g. ENOBUFS): never left the host
    late_max_ms: float  # how late the sender was against its schedule, at worst
    late_over_5ms: int  # packets sent more than 5 ms late
    sent_per_route: tuple[int, ...] = ()  # packets that left by each route (--bind/--dst pair), in order
    rerouted: int = 0  # packets that left by another route because theirs refused them


@dataclass(frozen=True)
class RecvResult:
    expected: int  # packets the sender said it sent (0 if no end marker arrived)
    received: int
    duplicates: int
    lost_spans: tuple[tuple[int, int], ...]  # [first, last] lost sequence numbers, inclusive
    latency_ms: dict[str, float] = field(default_factory=dict)  # p50, p99, max one-way latency

    @property
    def lost(self) -> int:
        return sum(b - a + 1 for a, b in self.lost_spans)

    @property
    def longest_span(self) -> int:
        return max((b - a + 1 for a, b in self.lost_spans), default=0)


def lost_spans(seen: bytearray, n: int) -> tuple[tuple[int, int], ...]:
    """Spans of sequence numbers in [0, n) not marked in `seen`."""
    spans: list[tuple[int, int]] = []
    start = None
    for i in range(n):
        got = i < len(seen) and seen[i]
        if not got and start is None:
            start = i
        elif got and start is not None:
            spans.append((start, i - 1))
            start = None
    if start is not None:
        spans.append((start, n - 1))
    return tuple(spans)


def summarise(seen: bytearray, expected: int, duplicates: int, latencies_ms: list[float] | None = None) -> RecvResult:
    """Lost spans among sequence numbers [0, expected) given a per-sequence 'seen' bitmap."""
    n = expected or len(seen)
    received = sum(seen[:n])
    lat: dict[str, float] = {}
    if latencies_ms:
        xs = sorted(latencies_ms)
        lat = {"p50": xs[len(xs) // 2], "p99": xs[min(len(xs) - 1, int(0.99 * len(xs)))], "max": xs[-1]}
    return RecvResult(expected, received, duplicates, lost_spans(seen, n), lat)


class _Stop(Exception):
    pass


def _stop(signum: int, frame: Any) -> None:
    raise _Stop(f"signal {signum}")


def _timer_slack_1ns() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except OSError:
        pass  # not Linux/glibc: the default 50 us slack only makes the pacing coarser


def receive(bind: str, port: int, idle_s: float, ready_file: str | None = None,
            max_packets: int = 50_000_000) -> RecvResult:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.bind((bind, port))
    sock.settimeout(idle_s)
    if ready_file:
        _write_atomically(ready_file, str(os.getpid()))
    seen = bytearray()
    expected = duplicates = ended_ns = 0
    started = False
    latencies: list[float] = []
    try:
        while True:
            if ended_ns and time.monotonic_ns() - ended_ns > END_GRACE_S * 1e9:
                break
            try:
                data = sock.recv(2048)
            except socket.timeout:
                if started or ended_ns:
                    break
                continue
            now_ns = time.monotonic_ns()
            if len(data) < HEADER.size:
                continue
            seq, marker, sent_ns = HEADER.unpack_from(data)
            if marker == END:
                if not ended_ns:  # packets sent just before it by another route may still arrive
                    expected, ended_ns = seq, now_ns
                    sock.settimeout(END_GRACE_S)
                continue
            if marker != MAGIC or seq >= max_packets:
                continue
            started = True
            if seq >= len(seen):
                seen.extend(bytes(seq + 1 - len(seen) + 4096))
            if seen[seq]:
                duplicates += 1
            seen[seq] = 1
            latencies.append((now_ns - sent_ns) / 1e6)
    except _Stop:
        pass
    finally:
        sock.close()
    return summarise(seen, expected, duplicates, latencies)


def send(dst: str | list[str], port: int, sport: int, rate_pps: float, seconds: float, bind: str | list[str] = "",
         start_file: str | None = None) -> SendResult:
    """Send on one route (`bind` -> `dst`) or several (paired lists: packet seq on route seq mod k)."""
    dsts = [dst] if isinstance(dst, str) else list(dst)
    binds = [bind] if isinstance(bind, str) else list(bind)
    if len(binds) == 1 and len(dsts) > 1:
        binds = binds * len(dsts)
    if not dsts or len(binds) != len(dsts):
        raise ValueError(f"give one --bind per --dst ({len(binds)} binds, {len(dsts)} destinations)")
    _timer_slack_1ns()
    socks = []
    for b in binds:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((b, sport))
        socks.append(sock)
    k = len(socks)
    payload = bytearray(PAYLOAD_BYTES)
    total = int(rate_pps * seconds)
    gap_ns = 1e9 / rate_pps
    errors: list[int] = []
    per_route = [0] * k
    rerouted = 0
    skip_until = [0] * k  # monotonic ns: a route that refused a packet rests until then
    retry_ns = int(ROUTE_RETRY_S * 1e9)
    late_max_ns = 0
    late_over = 0
    t0_ns = time.monotonic_ns() + 1_000_000  # 1 ms from now: everything below is warm by then
    if start_file:
        _write_atomically(start_file, repr(t0_ns / 1e9))
    try:
        for seq in range(total):
            due = t0_ns + int(seq * gap_ns)
            now = time.monotonic_ns()
            while now < due:
                left = due - now
                if left > 300_000:
                    time.sleep((left - 200_000) / 1e9)
                now = time.monotonic_ns()
            late = now - due
            late_max_ns = max(late_max_ns, late)
            late_over += late > 5_000_000
            HEADER.pack_into(payload, 0, seq, MAGIC, now)
            own = seq % k
            for i in range(k):
                r = (own + i) % k
                if i < k - 1 and skip_until[r] > now:
                    continue  # resting; the last route is always tried
                try:
                    socks[r].sendto(payload, (dsts[r], port))
                except OSError:
                    skip_until[r] = now + retry_ns
                    continue
                per_route[r] += 1
                rerouted += r != own
                break
            else:
                errors.append(seq)
        for _ in range(20):  # the end marker, repeated on every route: it may meet the same outage
            HEADER.pack_into(payload, 0, total, END, time.monotonic_ns())
            for sock, d in zip(socks, dsts):
                try:
                    sock.sendto(payload, (d, port))
                except OSError:
                    pass
            time.sleep(0.005)
    finally:
        for sock in socks:
            sock.close()
    return SendResult(t0_ns / 1e9, rate_pps, total - len(errors), tuple(errors), late_max_ns / 1e6, late_over,
                      tuple(per_route), rerouted)


def _write_atomically(path: str, text: str) -> None:
    """Readers polling for the file never see it half-written: write aside, then rename."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _write(path: str | None, data: dict[str, Any]) -> None:
    if path:
        _write_atomically(path, json.dumps(data))
    else:
        print(json.dumps(data))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic.probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", default="127.0.0.1")
    r.add_argument("--port", type=int, default=9000)
    r.add_argument("--idle-s", type=float, default=3.0)
    r.add_argument("--ready-file", help="written once the socket is bound")
    r.add_argument("--out", help="write the JSON result here (default: stdout)")
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True, action="append", help="destination address; repeat for more routes")
    s.add_argument("--port", type=int, default=9000)
    s.add_argument("--sport", type=int, required=True)
    s.add_argument("--bind", action="append", help="source address of each route, in --dst order (default: any)")
    s.add_argument("--rate-pps", type=float, default=5000.0, help="packets per second")
    s.add_argument("--seconds", type=float, default=5.0)
    s.add_argument("--start-file", help="written with the monotonic time packet 0 is due, just before sending")
    s.add_argument("--out", help="write the JSON result here (default: stdout)")
    args = ap.parse_args(argv)
    # A process started in the background by a non-interactive shell ignores SIGINT: SIGTERM too.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if args.cmd == "recv":
        res = receive(args.bind, args.port, args.idle_s, args.ready_file)
        _write(args.out, asdict(res) | {"lost": res.lost, "longest_span": res.longest_span})
        return 0
    if args.rate_pps <= 0 or args.seconds <= 0:
        ap.error("--rate-pps and --seconds must be > 0")
    binds = args.bind or [""]
    if len(binds) not in (1, len(args.dst)):
        ap.error(f"give one --bind, or one per --dst ({len(binds)} binds, {len(args.dst)} destinations)")
    try:
        sent = send(args.dst, args.port, args.sport, args.rate_pps, args.seconds, binds, args.start_file)
    except _Stop:
        return 143
    _write(args.out, asdict(sent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
