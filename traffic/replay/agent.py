"""The replay agent: one per emulated host, in its network namespace, sending real TCP bytes to its peers.

    python -m traffic.replay.agent --control /run/dir/control.sock --host h3

Control (the driver, `traffic.replay.driver`) speaks JSON lines over a Unix socket: a Unix socket is a
file, so it crosses network namespaces. The agent says hello, receives its plan (`ReplayPlan.agent_plan`:
its addresses, the connections it opens and accepts, and its part of every collective's transfer DAG),
listens, connects, reports ready, then runs collectives as the driver starts them and reports, per
collective, when each of its receives completed (CLOCK_MONOTONIC, shared by every process of the
machine, so the driver's clock and the agents' agree).

Data: persistent TCP connections (TCP_NODELAY), each opened from a planned source port so that the
controller's entropy rule puts it on a chosen path. A frame is a header (call, template, transfer,
part, bytes) and that many payload bytes. Sends follow the DAG with cut-through: a part may send its
byte i once every transfer it depends on has progressed past the same fraction (received here, or
sent by this host), so data is forwarded as it arrives, like NCCL's slices, and a connection's parts
leave in order. Payloads are zeros: nothing is computed, only moved.

In-server transfers (`nvlink_sends`, `nvlink_recvs` of a template: two GPUs of one server) move no byte:
once everything one depends on is complete, its sender waits its emulated NVLink time (`nvlink_s`), then
says `{"nvlink": call, ...}` to the driver, which passes it to the receiver's agent as its receive.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import socket
import struct
import sys
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Any

HEADER = struct.Struct("!IIIIQ")  # call, template, transfer, part, payload bytes
HELLO = struct.Struct("!4sI")  # magic, connection id
MAGIC = b"FLRP"
CHUNK = 256 * 1024
#: a send that waits for the data it forwards (cut-through) goes out in slices of at least this many
#: bytes (one full segment's payload at MTU 1500 with TCP timestamps), or the rest of its part. A part
#: smaller than the transfer it forwards (a transfer is split over its connections) would otherwise
#: forward each arriving segment as a fraction of one: with TCP_NODELAY, segments far below the MSS,
#: and the userspace datapath's cost is per packet (measured: DLRM's all-to-all sent 1.4-3.8x the
#: segments of the same bytes in full ones, and took up to 1.6x as long). Larger slices would coarsen
#: the pipeline: each hop of a chain waits for a slice (16 kB cost a ring of 16 hosts 20%).
MIN_SLICE = 1448
ZEROS = memoryview(bytes(CHUNK))


@dataclass
class OutPart:
    call: int
    template: int
    tid: int
    part: int
    size: int
    sent: int = 0
    header_done: bool = False


@dataclass
class OutConn:
    id: int
    sock: socket.socket
    queue: deque[OutPart] = field(default_factory=deque)
    pending: bytes = b""  # header (or hello) bytes not yet written
    connected: bool = False
    want_write: bool = False


@dataclass
class InConn:
    sock: socket.socket
    id: int = -1  # known once the hello arrived
    buf: bytearray = field(default_factory=bytearray)  # partial header
    cur: tuple[int, int, int] | None = None  # (call, template, transfer) of the part being read
    left: int = 0  # payload bytes left of the current part


@dataclass
class CallState:
    call: int
    template: int
    spec: dict[str, Any]
    started: float | None = None  # when the driver's start arrived
    recv_bytes: dict[int, int] = field(default_factory=dict)
    recv_size: dict[int, int] = field(default_factory=dict)
    recv_done: dict[int, float] = field(default_factory=dict)
    sent_bytes: dict[int, int] = field(default_factory=dict)
    send_size: dict[int, int] = field(default_factory=dict)
    send_deps: dict[int, list[int]] = field(default_factory=dict)
    local_progress: dict[int, float] = field(default_factory=dict)  # fraction
    local_deps: dict[int, list[int]] = field(default_factory=dict)
    # in-server sends: transfer -> (deps, receiving host, emulated seconds); when each is due, and done
    nv_sends: dict[int, tuple[list[int], str, float]] = field(default_factory=dict)
    nv_due: dict[int, float] = field(default_factory=dict)
    nv_done: set[int] = field(default_factory=set)
    reported: bool = False

    @classmethod
    def create(cls, call: int, template: int, spec: dict[str, Any]) -> "CallState":
        st = cls(call, template, spec)
        for tid, size in spec["recvs"]:
            st.recv_bytes[tid], st.recv_size[tid] = 0, size
        dest = {tid: parts[0][0] if parts else -1 for tid, _size, _deps, parts in spec["sends"]}
        conns = {tid: {c for c, _ in parts} for tid, _size, _deps, parts in spec["sends"]}
        for tid, size, deps, _parts in spec["sends"]:
            # an earlier send over the same connections is ordered by the connections themselves (FIFO)
            st.sent_bytes[tid], st.send_size[tid] = 0, size
            st.send_deps[tid] = [d for d in deps if not (d in conns and conns[d] >= conns[tid] and d in dest)]
        for tid, _size, deps in spec["local"]:
            st.local_progress[tid], st.local_deps[tid] = 0.0, deps
        for tid, _size, deps, dst, wait_s in spec.get("nvlink_sends", []):
            st.nv_sends[tid] = (deps, dst, wait_s)
        for tid in spec.get("nvlink_recvs", []):  # complete when the driver passes the sender's word on
            st.recv_bytes[tid], st.recv_size[tid] = 0, 0
        return st

    def fraction(self, tid: int) -> float:
        """How far transfer `tid` (received, sent or local here) has progressed, 0..1."""
        if tid in self.recv_size:
            size, have = self.recv_size[tid], self.recv_bytes[tid]
            if tid in self.recv_done:
                return 1.0
            return have / size if size else 0.0
        if tid in self.send_size:
            size, have = self.send_size[tid], self.sent_bytes[tid]
            if size == 0:
                return 1.0 if self.started is not None else 0.0
            return have / size
        if tid in self.local_progress:
            return self.local_progress[tid]
        if tid in self.nv_sends:
            return 1.0 if tid in self.nv_done else 0.0
        raise KeyError(f"call {self.call}: transfer {tid} is not known on this host")

    def allowed(self, deps: list[int]) -> float:
        return min((self.fraction(d) for d in deps), default=1.0)

    def done(self) -> bool:
        return (self.started is not None and len(self.recv_done) == len(self.recv_size)
                and all(self.sent_bytes[t] >= s for t, s in self.send_size.items())
                and all(p >= 1.0 for p in self.local_progress.values()) and len(self.nv_done) == len(self.nv_sends))


class Agent:
    def __init__(self, control: str, host: str) -> None:
        self.host = host
        self.sel = selectors.DefaultSelector()
        self.ctl = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.ctl.connect(control)
        self.ctl_buf = b""
        self.sel.register(self.ctl, selectors.EVENT_READ, ("ctl", None))
        self.plan: dict[str, Any] = {}
        self.out: dict[int, OutConn] = {}
        self.inc: list[InConn] = []
        self.calls: dict[int, CallState] = {}
        self.finished: set[int] = set()
        self.parts_done = 0
        self.expect_in: set[int] = set()
        self.ready_sent = False
        self.recvbuf = bytearray(CHUNK)
        self.running = True
        self.say({"hello": host, "pid": os.getpid()})

    # ---- control ---------------------------------------------------------------------------------
    def say(self, msg: dict[str, Any]) -> None:
        self.ctl.sendall((json.dumps(msg) + "\n").encode())

    def on_control(self) -> None:
        data = self.ctl.recv(1 << 20)
        if not data:
            self.running = False  # the driver is gone
            return
        self.ctl_buf += data
        while b"\n" in self.ctl_buf:
            line, self.ctl_buf = self.ctl_buf.split(b"\n", 1)
            self.handle(json.loads(line))

    def handle(self, msg: dict[str, Any]) -> None:
        if "setup" in msg:
            self.plan = msg["setup"]
            self.listen()
        elif "connect" in msg:
            self.connect()
        elif "start" in msg:
            self.start(int(msg["start"]), int(msg["template"]))
        elif "nvlink" in msg:  # an in-server transfer to this host is complete
            st = self.state(int(msg["nvlink"]), int(msg["template"]))
            st.recv_done.setdefault(int(msg["tid"]), time.monotonic())
            self.progress()
        elif "status" in msg:
            self.say({"status": self.status()})
        elif "stop" in msg:
            self.running = False

    def status(self) -> dict[str, Any]:
        """What this agent is waiting for: incomplete receives and the head of each send queue."""
        calls = {}
        for cid, st in self.calls.items():
            calls[str(cid)] = {
                "started": st.started is not None,
                "recv_waiting": {str(t): f"{st.recv_bytes[t]}/{st.recv_size[t]}" for t in st.recv_size
                                 if t not in st.recv_done},
                "send_waiting": {str(t): f"{st.sent_bytes[t]}/{st.send_size[t]}" for t in st.send_size
                                 if st.sent_bytes[t] < st.send_size[t]},
            }
        heads = {str(c.id): f"call {c.queue[0].call} transfer {c.queue[0].tid} {c.queue[0].sent}/{c.queue[0].size}"
                 f"{' (socket full)' if c.want_write else ''}" for c in self.out.values() if c.queue}
        return {"calls": calls, "queue_heads": heads}

    # ---- connections -----------------------------------------------------------------------------
    def listen(self) -> None:
        self.expect_in = set(self.plan["incoming"])
        for ip in self.plan["ips"]:
            for port in self.plan["ports"]:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((ip, port))
                s.listen(256)
                s.setblocking(False)
                self.sel.register(s, selectors.EVENT_READ, ("listen", None))
        self.say({"listening": True})

    def connect(self) -> None:
        for cid, src_ip, sport, dst_ip, port in self.plan["outgoing"]:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.bind((src_ip, sport))
            s.setblocking(False)
            err = s.connect_ex((dst_ip, port))
            if err not in (0, errno.EINPROGRESS):
                raise OSError(err, f"connect {src_ip}:{sport} -> {dst_ip}:{port}: {os.strerror(err)}")
            conn = OutConn(cid, s, pending=HELLO.pack(MAGIC, cid))
            self.out[cid] = conn
            self.sel.register(s, selectors.EVENT_WRITE, ("out", conn))
            conn.want_write = True
        self.maybe_ready()

    def maybe_ready(self) -> None:
        if self.ready_sent or not self.plan:
            return
        if all(c.connected and not c.pending for c in self.out.values()) and not self.expect_in:
            self.ready_sent = True
            self.say({"ready": True})

    def on_accept(self, lsock: socket.socket) -> None:
        s, _ = lsock.accept()
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = InConn(s)
        self.inc.append(conn)
        self.sel.register(s, selectors.EVENT_READ, ("in", conn))

    def set_write(self, conn: OutConn, on: bool) -> None:
        if conn.want_write != on:
            conn.want_write = on
            self.sel.modify(conn.sock, selectors.EVENT_WRITE if on else selectors.EVENT_READ, ("out", conn))

    # ---- collectives -----------------------------------------------------------------------------
    def state(self, call: int, template: int) -> CallState:
        st = self.calls.get(call)
        if st is None:
            spec = self.plan["templates"].get(str(template))
            if spec is None:
                raise KeyError(f"{self.host}: template {template} has nothing for this host")
            st = self.calls[call] = CallState.create(call, template, spec)
        return st

    def start(self, call: int, template: int) -> None:
        st = self.state(call, template)
        st.started = time.monotonic()
        for tid, _size, _deps, parts in st.spec["sends"]:
            for i, (cid, n) in enumerate(parts):
                self.out[cid].queue.append(OutPart(call, template, tid, i, n))
        self.progress()

    def progress(self, st: CallState | None = None) -> None:
        """Something moved: advance local transfers, push every connection until nothing more can
        move (a send may free a dependent send on another connection), report calls that are done."""
        while True:
            now = time.monotonic()
            for cs in self.calls.values():
                for tid, deps in cs.local_deps.items():
                    cs.local_progress[tid] = cs.allowed(deps)
                if cs.started is not None:
                    for tid, (deps, _dst, wait_s) in cs.nv_sends.items():
                        if tid not in cs.nv_due and cs.allowed(deps) >= 1.0:
                            cs.nv_due[tid] = now + wait_s
            self.parts_done = 0
            for conn in self.out.values():
                if conn.queue and conn.connected and not conn.want_write:
                    self.push(conn)
            if not self.parts_done:  # only a finished part can free a send on another connection
                break
        for cs in list(self.calls.values()):
            self.maybe_report(cs)

    def maybe_report(self, st: CallState) -> None:
        if not st.reported and st.done():
            st.reported = True
            self.say({"done": st.call, "host": self.host, "started": st.started, "reported": time.monotonic(),
                      "recv": sorted(st.recv_done.items())})
            del self.calls[st.call]
            self.finished.add(st.call)

    def push(self, conn: OutConn) -> int:
        """Write what the head of the connection's queue may send now; returns payload bytes written."""
        moved = 0
        try:
            if conn.pending:
                n = conn.sock.send(conn.pending)
                conn.pending = conn.pending[n:]
                if conn.pending:
                    self.set_write(conn, True)
                    return moved
            while conn.queue:
                p = conn.queue[0]
                st = self.calls[p.call]
                allowed = p.size if not st.send_deps[p.tid] else int(st.allowed(st.send_deps[p.tid]) * p.size)
                want = min(allowed - p.sent, CHUNK)
                if 0 < want < MIN_SLICE and allowed < p.size:
                    want = 0  # wait for a slice's worth (or the whole rest) of the data it forwards
                if not p.header_done:
                    if want <= 0 and p.size:
                        break  # the header goes with the first payload
                    conn.pending = HEADER.pack(p.call, p.template, p.tid, p.part, p.size)
                    p.header_done = True
                    # MSG_MORE: the header shares a segment with the payload sent right after it
                    n = conn.sock.send(conn.pending, socket.MSG_MORE if want > 0 else 0)
                    conn.pending = conn.pending[n:]
                    if conn.pending:
                        self.set_write(conn, True)
                        return moved
                if want > 0:
                    n = conn.sock.send(ZEROS[:want])
                    p.sent += n
                    st.sent_bytes[p.tid] += n
                    moved += n
                    if n < want:
                        self.set_write(conn, True)
                        return moved
                    continue
                if p.sent >= p.size:
                    conn.queue.popleft()
                    self.parts_done += 1
                    continue
                break  # waiting for data it depends on
        except BlockingIOError:
            self.set_write(conn, True)
            return moved
        self.set_write(conn, False)
        return moved

    def on_writable(self, conn: OutConn) -> None:
        if not conn.connected:
            err = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                raise OSError(err, f"{self.host}: connection {conn.id}: {os.strerror(err)}")
            conn.connected = True
        self.push(conn)  # the hello, or whatever the full socket held back
        self.maybe_ready()
        self.progress()

    def on_readable(self, conn: InConn) -> None:
        n = conn.sock.recv_into(self.recvbuf)
        if n == 0:
            self.sel.unregister(conn.sock)
            conn.sock.close()
            return
        data = memoryview(self.recvbuf)[:n]
        touched: set[int] = set()
        i = 0
        while i < n:
            if conn.id < 0:
                take = min(HELLO.size - len(conn.buf), n - i)
                conn.buf += data[i:i + take]
                i += take
                if len(conn.buf) == HELLO.size:
                    magic, cid = HELLO.unpack(bytes(conn.buf))
                    if magic != MAGIC:
                        raise ValueError(f"{self.host}: bad hello on an incoming connection")
                    conn.id = cid
                    conn.buf = bytearray()
                    self.expect_in.discard(cid)
                    self.maybe_ready()
                continue
            if conn.cur is None:
                take = min(HEADER.size - len(conn.buf), n - i)
                conn.buf += data[i:i + take]
                i += take
                if len(conn.buf) == HEADER.size:
                    call, template, tid, _part, size = HEADER.unpack(bytes(conn.buf))
                    conn.buf = bytearray()
                    conn.cur, conn.left = (call, template, tid), size
                    if size == 0:
                        self.received(call, template, tid, 0)
                        touched.add(call)
                        conn.cur = None
                continue
            take = min(conn.left, n - i)
            call, template, tid = conn.cur
            i += take
            conn.left -= take
            self.received(call, template, tid, take)
            touched.add(call)
            if conn.left == 0:
                conn.cur = None
        if touched:
            self.progress()

    def received(self, call: int, template: int, tid: int, n: int) -> None:
        if call in self.finished:
            raise ValueError(f"{self.host}: data for call {call}, which had already completed here")
        st = self.state(call, template)
        st.recv_bytes[tid] += n
        # every part carries at least one byte (a 0-byte transfer has exactly one part), so the
        # transfer is complete when its bytes are all in
        if st.recv_bytes[tid] >= st.recv_size[tid] and tid not in st.recv_done:
            st.recv_done[tid] = time.monotonic()

    def next_due(self) -> float:
        """When the next in-server send is due (inf: none waits)."""
        return min((t for cs in self.calls.values() for tid, t in cs.nv_due.items() if tid not in cs.nv_done),
                   default=float("inf"))

    def fire_due(self) -> None:
        """In-server sends whose NVLink time has passed: done, and the driver told (for their receivers)."""
        now = time.monotonic()
        fired = False
        for cs in list(self.calls.values()):
            for tid, t in list(cs.nv_due.items()):
                if tid not in cs.nv_done and t <= now:
                    cs.nv_done.add(tid)
                    fired = True
                    self.say({"nvlink": cs.call, "template": cs.template, "tid": tid, "to": cs.nv_sends[tid][1]})
        if fired:
            self.progress()

    # ---- loop ------------------------------------------------------------------------------------
    def run(self) -> None:
        while self.running:
            self.fire_due()
            wait = min(1.0, max(0.0, self.next_due() - time.monotonic()))
            for key, mask in self.sel.select(timeout=wait):
                kind, obj = key.data
                if kind == "ctl":
                    self.on_control()
                elif kind == "listen":
                    self.on_accept(key.fileobj)  # type: ignore[arg-type]
                elif kind == "in":
                    self.on_readable(obj)
                elif kind == "out" and mask & selectors.EVENT_WRITE:
                    self.on_writable(obj)
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m traffic.replay.agent", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--control", required=True, help="the driver's Unix socket")
    ap.add_argument("--host", required=True, help="the emulated host this agent runs in")
    args = ap.parse_args(argv)
    try:
        Agent(args.control, args.host).run()
    except Exception:  # noqa: BLE001 - reported, and the driver fails the run naming this host
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
