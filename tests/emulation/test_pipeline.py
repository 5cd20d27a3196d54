"""One pipeline for both backends (docs/architecture.md): a small workload run on the emulation (real
OVS, the controller, real TCP bytes) and on the simulator gets the same planned connections (ids,
5-tuples, planes, lanes) and the same run description (`RunMeta`), differing only where a backend differs
by nature: its name, its wall-clock times, the scaling the emulation runs at (the simulator runs at the
real rates) and the notes each backend adds about itself."""
from __future__ import annotations

import dataclasses

import pytest

from fabric import topofile
from fabriclab.backends import Emulated, Simulated, run_workload
from tests.test_replay import coll, workload
from traffic.replay import ReplayOptions, place
from traffic.replay.plan import SCALING_NOTES

pytestmark = pytest.mark.emulation

#: RunMeta fields a backend sets by nature (the rest must be equal)
BACKEND_FIELDS = {"backend", "started_wall", "duration_s", "mbps_per_gbps", "dilation", "bytes_scale", "notes"}


def five_tuples(connections):
    return [(c.id, c.src_ip, c.sport, c.dst_ip, c.dport, "tcp", c.plane, c.lane) for c in connections]


def test_both_backends_run_the_same_plan_and_describe_the_run_alike(tmp_path):
    fab = topofile.load("dual-plane-16")
    # two streams (two lanes of connections), a ring all-reduce and an all-to-all over 8 ranks on 8 hosts
    w = workload([coll(size=400_000, n=8, stream="0", start=0, dur=100),
                  coll("all_to_all", size=200_000, n=8, stream="1", start=0, dur=100)], n=8)
    opts = ReplayOptions(ports="planned", channels=1)
    emu = run_workload(w, "pipeline", fab, "adaptive", opts, Emulated(), out_dir=tmp_path / "emu")
    sim = run_workload(w, "pipeline", fab, "adaptive", opts, Simulated())

    # the connections the agents were given are the simulator's, one for one
    given = place(emu.plan).connections
    assert five_tuples(given) == five_tuples(sim.plan.connection_list())
    # counted by hand: lane 0's ring has 8 pairs, lane 1's all-to-all 8 x 7; one channel on each of 2 planes
    assert len(given) == (8 + 8 * 7) * 2
    assert {c.plane for c in given} == {p.name for p in fab.planes} and {c.lane for c in given} == {0, 1}
    assert len({(c.src_ip, c.sport, c.dst_ip, c.dport) for c in given}) == len(given)

    e, s = dataclasses.asdict(emu.result.meta), dataclasses.asdict(sim.result.meta)
    assert (e["backend"], s["backend"]) == ("emulation", "flowsim")
    assert {k: v for k, v in e.items() if k not in BACKEND_FIELDS} == \
        {k: v for k, v in s.items() if k not in BACKEND_FIELDS}
    assert s["mbps_per_gbps"] == 1000.0 and s["dilation"] == 1.0 and e["dilation"] > 1.0
    # the notes of the workload and the plan (scaling aside) are the same, in the same order, first
    shared = [n for n in emu.plan.workload.notes] + [n for n in emu.plan.notes if not n.startswith(SCALING_NOTES)]
    assert list(sim.result.meta.notes[:len(shared)]) == shared
    assert [n for n in emu.result.meta.notes if not n.startswith(SCALING_NOTES)][:len(shared)] == shared
    # the same collectives and steps, timed by each backend
    key = [(c.index, c.step, c.kind, c.size_bytes, c.group_size, c.stream, c.transfers) for c in emu.result.collectives]
    assert key == [(c.index, c.step, c.kind, c.size_bytes, c.group_size, c.stream, c.transfers)
                   for c in sim.result.collectives]
    assert all(c.duration_real_us > 0 for c in emu.result.collectives + sim.result.collectives)
    assert [(x.step, x.repeat, x.rank) for x in emu.result.steps] == [(x.step, x.repeat, x.rank) for x in sim.result.steps]
