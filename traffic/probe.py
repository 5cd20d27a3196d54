"""A paced UDP probe with sequence numbers, for measuring outages as lost-sequence spans.

    python -m traffic.probe recv --bind 198.18.0.16 --port 9000 --out result.json [--idle-s 2]
    python -m traffic.probe send --dst 198.18.0.16 --port 9000 --sport 49152 --rate 5000 --seconds 10

The sender paces packets at `--rate` per second from a fixed source port (so its ECMP path is fixed,
see fabric.routing.entropy); each carries a 64-bit sequence number. The receiver writes which
sequence numbers arrived, summarised as lost spans, when the sender's end marker arrives or after
`--idle-s` without packets. An outage of a path shows up as one span of lost sequence numbers;
divided by the rate it is the outage's length, independent of receiver scheduling gaps.
"""
from __future__ import annotations

import argparse
import json
import signal
import socket
import struct
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

HEADER = struct.Struct("!QQ")  # sequence number, magic / end marker
MAGIC = 0xFAB1AB00
END = 0xFAB1ABFF
PAYLOAD_BYTES = 64


@dataclass(frozen=True)
class ProbeResult:
    expected: int  # packets the sender said it sent (0 if the end marker never arrived)
    received: int
    duplicates: int
    lost: int
    lost_spans: list[tuple[int, int]]  # [first, last] lost sequence numbers, inclusive

    @property
    def longest_span(self) -> int:
        return max((b - a + 1 for a, b in self.lost_spans), default=0)


def summarise(seen: bytearray, expected: int, duplicates: int) -> ProbeResult:
    """Lost spans among sequence numbers [0, expected) given a per-sequence 'seen' bitmap."""
    n = expected or len(seen)
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
    received = sum(seen[:n])
    return ProbeResult(expected, received, duplicates, n - received, spans)


def receive(bind: str, port: int, idle_s: float, max_packets: int = 50_000_000) -> ProbeResult:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((bind, port))
    sock.settimeout(idle_s)
    seen = bytearray()
    expected = 0
    duplicates = 0
    started = False
    while True:
        try:
            data = sock.recv(2048)
        except socket.timeout:
            if started:
                break
            continue
        except InterruptedError:
            break
        if len(data) < HEADER.size:
            continue
        seq, marker = HEADER.unpack_from(data)
        if marker == END:
            expected = seq
            break
        if marker != MAGIC or seq >= max_packets:
            continue
        started = True
        if seq >= len(seen):
            seen.extend(bytes(seq + 1 - len(seen) + 4096))
        if seen[seq]:
            duplicates += 1
        seen[seq] = 1
    sock.close()
    return summarise(seen, expected, duplicates)


def send(dst: str, port: int, sport: int, rate: float, seconds: float, bind: str = "") -> int:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((bind, sport))
    payload = bytearray(PAYLOAD_BYTES)
    total = int(rate * seconds)
    gap = 1.0 / rate
    t0 = time.perf_counter()
    for seq in range(total):
        due = t0 + seq * gap
        while True:
            left = due - time.perf_counter()
            if left <= 0:
                break
            if left > 0.0003:
                time.sleep(left - 0.0002)
        HEADER.pack_into(payload, 0, seq, MAGIC)
        try:
            sock.sendto(payload, (dst, port))
        except OSError:
            pass  # e.g. ENOBUFS: the packet is lost like any other
    for _ in range(20):  # the end marker, repeated: it may meet the same outage
        HEADER.pack_into(payload, 0, total, END)
        sock.sendto(payload, (dst, port))
        time.sleep(0.005)
    sock.close()
    return total


def _stop_receiving(signum: int, frame: Any) -> None:
    """SIGTERM ends the receive loop; the result so far is still written."""
    raise InterruptedError(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic.probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("recv")
    r.add_argument("--bind", default="127.0.0.1")
    r.add_argument("--port", type=int, default=9000)
    r.add_argument("--idle-s", type=float, default=3.0)
    r.add_argument("--out", help="write the JSON result here (default: stdout)")
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, default=9000)
    s.add_argument("--sport", type=int, required=True)
    s.add_argument("--bind", default="")
    s.add_argument("--rate", type=float, default=5000.0, help="packets per second")
    s.add_argument("--seconds", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.cmd == "recv":
        signal.signal(signal.SIGTERM, _stop_receiving)
        res = receive(args.bind, args.port, args.idle_s)
        out: dict[str, Any] = asdict(res) | {"longest_span": res.longest_span}
        text = json.dumps(out)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            print(text)
        return 0
    if args.rate <= 0 or args.seconds <= 0:
        ap.error("--rate and --seconds must be > 0")
    sent = send(args.dst, args.port, args.sport, args.rate, args.seconds, args.bind)
    print(json.dumps({"sent": sent}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
