"""The replay without root: the plan (calls, concurrency, connections and their paths, scaling, parts),
the analysis (real units, busbw, composed steps), and the real agents and driver moving real TCP bytes
over loopback (every host an address of 127.0.0.0/8, every process local)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fabric import builders, topofile
from fabric.routing import EcmpPolicy, PathTable
from fabric.transfers import TransferError
from tests.localhosts import LocalHosts
from traffic import collectives
from traffic.replay import ReplayError, ReplayOptions, build_result, place, plan_replay
from traffic.replay.driver import CallTiming, Driver, RawRun
from traffic.replay.emulated import emulated_run
from traffic.workload import Collective, RankTrace, Step, TraceError, Workload


def workload(colls, n=4, timed=True, steps=1, duration_us=1000.0, compute=((0.0, 100.0),)):
    """A data-parallel workload: every rank has the same steps."""
    step_list = tuple(Step(s, duration_us if timed else None, compute if timed else (), tuple(colls))
                      for s in range(steps))
    return Workload("synthetic", "synthetic", "kineto", n, tuple(RankTrace(r, step_list) for r in range(n)), timed)


def coll(kind="all_reduce", size=4000, n=4, stream="0", start=None, dur=None):
    return Collective(kind, size, "float32", tuple(range(n)), stream, start, dur)


DP16 = topofile.load("dual-plane-16")


def test_connections_take_distinct_paths_in_both_planes():
    w = workload([coll(size=16_000_000, n=16)], n=16)
    plan = plan_replay(w, DP16, ReplayOptions(channels=2, dilation=1000))
    # ring h0 -> h1 -> ... -> h15 -> h0: 16 host pairs x 2 planes x 2 channels
    connections = place(plan).connections
    assert len(connections) == 16 * 2 * 2
    pol = EcmpPolicy(PathTable(DP16))
    conns = [c for c in connections if (c.src_host, c.dst_host) == ("h3", "h4")]  # leaf 0 -> leaf 1
    paths = {pol.path(DP16.nic_by_ip[__import__("ipaddress").IPv4Address(c.src_ip)],
                      DP16.nic_by_ip[__import__("ipaddress").IPv4Address(c.dst_ip)], c.sport) for c in conns}
    # four connections, four paths: each plane's two spines
    assert {p[2] for p in paths} == {"spineA0", "spineA1", "spineB0", "spineB1"}
    assert len({(c.src_ip, c.sport, c.dst_ip, c.dport) for c in connections}) == len(connections)


def test_bytes_scale_parts_and_the_chosen_dilation_by_hand():
    # 16 ranks ring all-reduce of 16 MB on dual-plane-16 (2 x 200G per host); the default link scale puts
    # the fastest NIC at 1 Mbit/s: 1 / 200 = 0.005 Mbit/s per Gbit/s
    w = workload([coll(size=16_000_000, n=16)], n=16)
    plan = plan_replay(w, DP16, ReplayOptions())
    assert plan.mbps_per_gbps == pytest.approx(0.005)
    # a ring transfer is 16 MB / 16 = 1 MB real, split over 2 planes: 500 kB per NIC; at bytes scale 1
    # that takes 500e3 x 8 / 1e6 = 4 s on a 1 Mbit/s NIC; the typical transfer should take 0.2 s:
    # bytes scale 0.05, dilation = 0.05 x 1000 / 0.005 = 10000
    assert plan.bytes_scale == pytest.approx(0.05)
    assert plan.dilation == pytest.approx(10_000)
    (t,) = place(plan).placed
    assert t.template.emu_bytes == 800_000 and len(t.transfers) == 2 * 15 * 16
    first = t.transfers[0]
    assert first.size_bytes == 50_000 and [p.size_bytes for p in first.parts] == [12_500] * 4
    # pyramid-16's NICs are 400G: scale 1 / 400; one NIC per host carries the whole transfer, so the
    # typical transfer takes as long, and the dilation is the same
    pyr = plan_replay(w, topofile.load("pyramid-16"), ReplayOptions())
    assert pyr.mbps_per_gbps == pytest.approx(0.0025) and pyr.dilation == pytest.approx(10_000)
    assert sum(p.size_bytes for x in t.transfers for p in x.parts) == sum(x.size_bytes for x in t.transfers)


def test_concurrent_in_the_trace_concurrent_in_the_replay():
    # stream 0: A [0, 100]; stream 1: B [50, 300] overlaps A; stream 0: C [150, 200] after A ended;
    # stream 1: D [310, 320] after B (and after C)
    colls = [coll(stream="0", start=0, dur=100), coll(stream="1", size=8000, start=50, dur=250),
             coll(stream="0", size=2000, start=150, dur=50), coll(stream="1", size=1000, start=310, dur=10)]
    plan = plan_replay(workload(colls, steps=2), DP16, ReplayOptions(dilation=1000, repeat=2))
    # what each call waits for, directly or through the calls it waits for (the plan keeps only what is
    # not implied: D waits for B and C, C for A)
    waits: list[set[int]] = []
    for c in plan.calls:
        waits.append(set(c.deps).union(*(waits[d] for d in c.deps)))
    assert waits[:4] == [set(), set(), {0}, {0, 1, 2}]
    # step 2 waits for all of step 1, and the repetition for all of the last step before it
    assert waits[4] == waits[5] == {0, 1, 2, 3}
    assert waits[8] >= {4, 5, 6, 7} and len(plan.calls) == 16
    # each stream has its own connections (a lane): concurrent collectives never queue behind each other
    lanes = {c.lane for c in place(plan).connections}
    assert lanes == {0, 1}


def test_untimed_traces_replay_one_after_another():
    colls = [coll(size=1000), coll(size=2000), coll(size=3000)]
    plan = plan_replay(workload(colls, timed=False), DP16, ReplayOptions(dilation=1000))
    assert [c.deps for c in plan.calls] == [(), (0,), (1,)]
    assert any("no timings" in n for n in plan.notes)


def test_multi_rank_traces_keep_their_ranks_and_must_agree():
    per_rank = [RankTrace(r, (Step(0, 1000.0, ((0.0, 10.0),), (coll("all_to_all", 8000, 8, start=0, dur=10),
                                                                 coll("all_reduce", 800, 8, start=20, dur=10))),))
                for r in range(8)]
    w = Workload("mr", "mr", "kineto", 8, tuple(per_rank), True)
    plan = plan_replay(w, DP16, ReplayOptions(dilation=1000))
    assert len(plan.placement) == 8 and plan.placement.hosts == tuple(f"h{i}" for i in range(8))
    assert [len(c.rank_index) for c in plan.calls] == [8, 8]
    bad = list(per_rank)
    bad[3] = RankTrace(3, (Step(0, 1000.0, (), (coll("all_reduce", 800, 8), coll("all_reduce", 800, 8))),))
    with pytest.raises(ReplayError, match="rank 3's collective #0 .* is all_reduce"):
        plan_replay(Workload("mr", "mr", "kineto", 8, tuple(bad), True), DP16, ReplayOptions(dilation=1000))
    with pytest.raises(TraceError, match="cannot be mapped"):
        sub = [RankTrace(r, (Step(0, 1.0, (), (Collective("all_reduce", 8, "f", (0, 1), "0"),)),)) for r in range(4)]
        plan_replay(Workload("s", "s", "kineto", 4, tuple(sub), False), DP16, ReplayOptions(ranks=16))


def test_placements_and_local_transfers():
    w = workload([coll(size=3200, n=32)], n=32)
    # 32 ranks on 16 hosts: block puts 2 per host, and the ring's rank 0 -> 1 would move bytes inside h0 for
    # free (a host is one GPU): refused, naming both counts (issue 42, defect 4; tests/test_shared_hosts.py).
    # Local transfers between two GPUs of a server are placed in tests/test_in_server.py.
    with pytest.raises(ReplayError, match=r"32 ranks on 16 hosts: 2 ranks would share a host \(h0: ranks 0, 1"):
        plan_replay(w, DP16, ReplayOptions(dilation=1000))
    spread = plan_replay(workload([coll(n=4)]), DP16, ReplayOptions(placement="spread", dilation=1000))
    assert spread.placement.hosts == ("h0", "h4", "h8", "h12")
    with pytest.raises(TransferError):
        plan_replay(workload([coll(n=4)]), DP16, ReplayOptions(placement="/no/such/file.yaml"))


def test_bad_options_are_refused():
    for opts, msg in ((ReplayOptions(channels=0), "--channels"), (ReplayOptions(repeat=0), "--repeat"),
                      (ReplayOptions(dilation=0.0), "--dilation"), (ReplayOptions(compute="napping"), "--compute"),
                      (ReplayOptions(compute="slept"), "not implemented yet")):
        with pytest.raises(ReplayError, match=msg):
            plan_replay(workload([coll()]), DP16, opts)


def test_analysis_converts_to_real_units_and_composes_steps():
    # one 4-rank all-reduce of 4000 real bytes taking 2 s emulated at dilation 1000: 2 ms real;
    # algbw = 4000 x 8 / 2e-3 = 16 Mbit/s, busbw = x 2(4-1)/4 = 24 Mbit/s
    step = [coll(size=4000, start=200.0, dur=100.0)]
    plan = plan_replay(workload(step, compute=((0.0, 200.0), (300.0, 500.0)), duration_us=500.0), DP16,
                       ReplayOptions(dilation=1000))
    raw = RawRun([CallTiming(0, 10.0, 12.0)], [], 0.5, 9.0, 13.0, 0.0)
    res = build_result(plan, emulated_run(plan, raw), trace="t", routing="ecmp")
    (c,) = res.collectives
    assert c.duration_real_us == pytest.approx(2000.0)
    assert c.algbw_bps == pytest.approx(16e6) and c.busbw_bps == pytest.approx(24e6)
    # compute [0, 200], the collective (now 2000 us) from 200, compute [300, 500] that waited for it in
    # the recording (it started right when the collective ended): 200 + 2000 + 200 = 2400 us
    (s,) = res.steps
    assert s.step_us == pytest.approx(2400.0)
    assert s.compute_us == pytest.approx(400.0) and s.exposed_comm_us == pytest.approx(2000.0)
    assert s.idle_us == pytest.approx(0.0)


def loopback(plan):
    """The same plan with every address moved to 127.0.0.0/8 (plane A .1.x, plane B .2.x)."""
    import dataclasses
    import ipaddress

    def lo(ip):
        a = ipaddress.IPv4Address(ip)
        return str(ipaddress.IPv4Address(f"127.0.{a.packed[1] - 17}.{a.packed[3]}"))
    def moved(nic):
        return dataclasses.replace(nic, ip=ipaddress.IPv4Address(lo(str(nic.ip))))
    placed = place(plan)
    conns = tuple(dataclasses.replace(c, src=moved(c.src), dst=moved(c.dst)) for c in placed.connections)
    fab = plan.fabric

    class P(type(placed)):
        def agent_plan(self, host):
            d = super().agent_plan(host)
            d["ips"] = [lo(str(n.ip)) for n in fab.nics_of[host]]
            return d
    return P(placed.plan, placed.placed, conns)


@pytest.mark.parametrize("kind, algorithm, n", [("all_reduce", "ring", 4), ("all_reduce", "tree", 4),
                                                ("all_reduce", "halving_doubling", 4), ("all_to_all", "auto", 4),
                                                ("broadcast", "auto", 3)])
def test_agents_move_every_byte_in_dependency_order_over_loopback(tmp_path: Path, kind, algorithm, n):
    fab = builders.dual_plane(hosts=4, hosts_per_leaf=2, spines_per_plane=2)
    size = 200_000 if kind != "broadcast" else 90_000
    w = workload([coll(kind, size, n, start=0, dur=100), coll(kind, size // 2, n, stream="1", start=0, dur=100)], n=n)
    plan = loopback(plan_replay(w, fab, ReplayOptions(dilation=1000, algorithm=algorithm, mbps_per_gbps=1.0,
                                                      repeat=2, port=17000 + n * 10)))
    done = []
    raw = Driver(plan, LocalHosts(fab), tmp_path, None, 0.5, lambda k, total, call: done.append(k)).run()
    assert done == list(range(1, len(plan.plan.calls) + 1))
    for call, tm in zip(plan.plan.calls, raw.timings):
        t = plan.placed[call.template]
        dag = collectives.schedule(kind, t.template.size_bytes, list(range(n)), t.template.algorithm)
        network = [i for i, x in enumerate(t.transfers) if not x.local]
        # every network transfer was received in full, and never before what it depends on (a transfer that forwards
        # data: the agents forward as data arrives, so a 0-byte one, the tree's fill and drain tokens, may be
        # received once its dependency has begun)
        assert set(tm.received_s) == set(network)
        for i in network:
            if dag.transfers[i].size_bytes == 0:
                continue
            for d in dag.transfers[i].deps:
                if d in tm.received_s and dag.transfers[d].dst == dag.transfers[i].src:
                    assert tm.received_s[d] <= tm.received_s[i] + 1e-3
        assert tm.start_s <= min(tm.received_s.values()) and tm.end_s == max(tm.received_s.values())


def test_an_agent_that_dies_fails_the_run_naming_its_host(tmp_path: Path):
    fab = builders.dual_plane(hosts=4, hosts_per_leaf=2, spines_per_plane=2)
    plan = loopback(plan_replay(workload([coll(size=100_000)]), fab, ReplayOptions(dilation=1000, port=17500)))

    class Broken(LocalHosts):
        def popen(self, host, args, **kwargs):
            if host == "h2":
                args = [args[0], "-c", "import sys; sys.exit(3)"]
            return super().popen(host, args, **kwargs)

    with pytest.raises(ReplayError, match="agent on h2 exited with code 3"):
        Driver(plan, Broken(fab), tmp_path, None, 0.5, setup_timeout_s=20).run()


def test_the_controller_polls_slower_on_slower_emulated_links():
    from fabric import topofile
    from fabriclab.backends import controller_poll_ms

    dp = topofile.load("dual-plane-16")  # 200G NICs
    # 10 ms at 20 Mbit/s, the same bytes per poll below it, within 10..100 ms
    assert controller_poll_ms(dp, 0.1) == 10.0  # 20 Mbit/s
    assert controller_poll_ms(dp, 0.02) == 50.0  # 4 Mbit/s
    assert controller_poll_ms(dp, 0.005) == 100.0  # 1 Mbit/s: 200 ms, capped
    assert controller_poll_ms(dp, 1.0) == 10.0  # 200 Mbit/s: never below 10 ms
