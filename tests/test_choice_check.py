"""NCCL's choice checked alone on the fabric (`traffic.replay.alone`): the run's notes name a chosen algorithm that
simulates > 10% slower than another, with both times, worked out by hand."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fabric import topofile
from fabric.flowsim import SimOptions
from tests.conftest import simulated
from traffic.replay import ReplayOptions
from traffic.replay.alone import one_collective

ROOT = Path(__file__).resolve().parents[1]
S = 4 << 30  # 4 GiB


def two_servers():
    # dual-plane-1024-rail's template at 16 hosts: 2 servers of 8 GPUs, each GPU's NIC 2 x 200 G (one port a plane)
    fab = topofile.scaled(ROOT / "topologies" / "dual-plane-1024-rail.yaml", 16)
    assert fab.gpus_per_server == 8 and {p.rate_gbps for p in fab.nic_ports} == {200.0}
    return fab


def test_a_chosen_ring_slower_than_the_tree_is_named_with_both_times():
    # all_reduce of 4 GiB over 2 servers x 8 GPUs. NCCL's tuning model picks the ring here. By hand, no latencies:
    # - ring (one per NIC): each NIC sends 2(kN-1)/(kN) x S/k = 2 x 15/16 x S/8 at 400 G: 20.13 ms;
    # - tree on 2 servers: each tree has one edge; per NIC and tree S/(2k) goes up it and S/(2k) down, and the two
    #   trees run it opposite ways, so each NIC direction carries 2 x S/(2k) = S/8 at 400 G: 10.74 ms.
    # The ring is 1.875x the tree: over 10% slower, so the run says so.
    fab = two_servers()
    nic_bps = 400e9
    ring_s = 2 * 15 / 16 * S / 8 * 8 / nic_bps
    tree_s = S / 8 * 8 / nic_bps
    res = simulated(one_collective("all_reduce", S, tuple(range(16)), 16), "t", fab, "adaptive",
                    ReplayOptions(algorithm="nccl", ports="planned"), SimOptions())
    assert res.collectives[0].algorithm == "ring"
    note = next(n for n in res.meta.notes if n.startswith("NCCL's choice checked alone"))
    m = re.search(r"all_reduce 4\.00 GiB over 16 GPUs \(2 servers\): NCCL's ring/Simple ([\d.]+) us, tree/Simple ([\d.]+) us",
                  note)
    assert m, note
    assert float(m.group(1)) * 1e-6 == pytest.approx(ring_s, rel=0.01)
    assert float(m.group(2)) * 1e-6 == pytest.approx(tree_s, rel=0.01)


def test_a_choice_within_ten_percent_and_a_forced_algorithm_say_nothing_against_it():
    # all_gather of 16 MiB over the 16 GPUs: only the ring runs it at 8 GPUs a server (PAT needs one a server, the
    # tree is all-reduce only): nothing to check, no note. A forced algorithm (--nccl-algo ring) is the user's own
    # choice: no check either. 4 GiB all_reduce on one GPU a server (2 servers): ring 2 x 1/2 x S vs tree S per NIC
    # direction, equal by hand: "within 10%".
    fab = two_servers()
    for kind, size, ranks, algo in (("all_gather", 16 << 20, tuple(range(16)), "auto"),
                                    ("all_reduce", S, tuple(range(16)), "ring")):
        res = simulated(one_collective(kind, size, ranks, 16), "t", fab, "adaptive",
                        ReplayOptions(algorithm="nccl", nccl_algo=algo, ports="planned"), SimOptions())
        assert not [n for n in res.meta.notes if n.startswith("NCCL's choice checked alone")]
    res = simulated(one_collective("all_reduce", S, (0, 8), 16), "t", fab, "adaptive",
                    ReplayOptions(algorithm="nccl", ports="planned"), SimOptions())
    note = next(n for n in res.meta.notes if n.startswith("NCCL's choice checked alone"))
    assert "1 collective shape(s)" in note and note.endswith("each within 10% of the best"), note
