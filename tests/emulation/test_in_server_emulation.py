"""In-server transfers on the emulation (dual-plane-16 as servers of 4 GPUs, hosts 4s..4s+3 = leaf s):
they never touch the fabric (the switches' own port counters towards the in-server receivers stay
empty) and take their NVLink time, scaled like everything else (x the dilation).

Hand values: a ring all-reduce of S bytes over n GPUs is 2(n - 1) steps of S/n bytes, each after the one
before: 2(n - 1) x (S/n) x 8 / B seconds at B bit/s; a count-c collective is c of them back to back."""
from __future__ import annotations

import dataclasses

import pytest

from fabric import topofile
from tests.conftest import replayed
from traffic.replay import ReplayOptions
from traffic.workload import Collective, RankTrace, Step, Workload

pytestmark = pytest.mark.emulation

NVLINK_GBPS = 3600.0
SERVERS = dataclasses.replace(topofile.load("dual-plane-16"), gpus_per_server=4, nvlink_gbps=NVLINK_GBPS)


def coll(kind, size, ranks, start, *, count=1, stream="0"):
    return Collective(kind, size, "float32", tuple(ranks), stream, start, 100.0, count=count)


def test_in_server_calls_take_their_nvlink_time_and_no_fabric_bytes(tmp_path):
    ring = coll("all_reduce", 8_000_000, range(8), 100.0)  # 2 servers: chunks of 1 MB
    send = coll("send_recv", 1_000_000, (0, 4), 300.0, stream="1")  # across the fabric
    tp = coll("all_reduce", 4_000_000, range(4), 500.0, count=12, stream="2")  # server 0 only
    ranks = tuple(RankTrace(r, (Step(0, 1000.0, ((0.0, 100.0),), tuple(c for c in (ring, send, tp)
                                                                        if r in c.group_ranks)),))
                  for r in range(16))
    w = Workload("servers", "synthetic", "kineto", 16, ranks, True)
    result = replayed(w, "servers", SERVERS, "ecmp", ReplayOptions(), out_dir=tmp_path)
    by_stream = {c.stream: c for c in result.collectives}
    # the TP call: 12 x 6 steps of 1 MB at 3600 Gbit/s = 12 x 13.33 us = 160 us real (tolerance 1%: the
    # driver holds it for its scaled time)
    tp_us = 12 * 2 * 3 * 1_000_000 * 8 / (NVLINK_GBPS * 1e9) * 1e6
    assert by_stream["2"].duration_real_us == pytest.approx(tp_us, rel=0.01)
    # the mixed ring runs as NCCL maps it, one ring per NIC (4 rings of 2 MB, chunks of 250 kB): it waits at
    # least h0's 14 sends to h1, each 250 kB over NVLink
    assert by_stream["0"].duration_real_us >= 14 * 250_000 * 8 / (NVLINK_GBPS * 1e9) * 1e6
    # the switches' counters: ring j leaves each server through GPU j's NIC to the other server's GPU j, so into
    # every GPU h0..h7 its ring's 14 chunks of 250 kB (h4 also the 1 MB send), plus the ACKs of the 14 it sends
    # (66-byte ACKs for 1448-byte segments, and control traffic: measured 9.6% of the bytes on h0; bound 20%)
    chunk = 250_000 * result.meta.bytes_scale

    def into(host):
        return sum(l.emu_bytes for l in result.links if l.tier == "host" and l.peer == host)

    for h in ("h0", "h1", "h2", "h3", "h4", "h5", "h6", "h7"):
        extra = 4 * chunk if h == "h4" else 0  # the 1 MB send
        assert 14 * chunk + extra <= into(h) < 1.2 * (14 * chunk + extra), (h, into(h), chunk)
