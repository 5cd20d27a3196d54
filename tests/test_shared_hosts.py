"""Ranks that share a host (issue 42, defect 4): refused where they would move bytes for free.

A host of the model is one GPU and its NIC on every fabric (a server of G GPUs is G hosts), so two ranks
on one host are two ranks on one GPU. Before, 24 ranks on dual-plane-16 (block: 2 per host) ran the bytes
between the two ranks of a host in no time (a 16 MiB all-reduce of such a pair took 0.001 us, the
simulator's resolution). Now the plan refuses them, naming the counts; between two GPUs of one server
(two hosts) bytes go over NVLink at the fabric's `nvlink_gbps`; ranks that share a host but exchange
nothing between them are allowed and share its NIC.

Hand values (bandwidth only: the library's per-transfer and per-hop costs are 0):
- a ring all-reduce of S = 16 MiB over 2 GPUs of one server: 2(n - 1) = 2 steps of S/2 = 8 MiB, one after
  the other, at 3600 Gbit/s: 2 x 8,388,608 x 8 / 3.6e12 s = 37.2827 us; busbw = S x 2(n-1)/n x 8 / t =
  3600 Gbit/s, the NVLink rate.
- a send_recv of 1 MB between two GPUs of one server: 8e6 / 3.6e12 s = 2.2222 us.
- two concurrent 1 MB send_recvs out of one host (h0, 2 x 200G NICs, both receivers on its leaf):
  max-min gives each 200 Gbit/s, so each takes 8e6 / 2e11 s = 40 us (20 us alone).
"""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from fabric import builders, topofile
from tests.conftest import simulated
from traffic.replay import ReplayOptions
from traffic.replay.plan import ReplayError
from traffic.replay.simulate import plan_for_simulation
from traffic.workload import Collective, RankTrace, Step, Workload

ROOT = Path(__file__).resolve().parent.parent
MIB16 = 16 * 1024 * 1024
NVLINK_GBPS = 3600.0
G = 4


def servers_fabric():
    return dataclasses.replace(builders.dual_plane(hosts=16, hosts_per_leaf=4), gpus_per_server=G,
                               nvlink_gbps=NVLINK_GBPS)


def coll(kind, size, ranks, *, stream="0", start=200.0, dur=500.0):
    return Collective(kind, size, "float32", tuple(ranks), stream, start, dur)


def one_step(*colls: Collective, n: int) -> Workload:
    """`n` ranks, one timed step; each rank has the collectives whose group it is in."""
    ranks = tuple(RankTrace(r, (Step(0, 10_000.0, ((0.0, 100.0),), tuple(c for c in colls if r in c.group_ranks)),))
                  for r in range(n))
    return Workload("shared", "shared", "kineto", n, ranks, True)


def data_parallel_all_reduce(size: int) -> Workload:
    """A one-rank (data-parallel) trace of one all-reduce, for `--ranks N` to map."""
    return one_step(coll("all_reduce", size, (0,)), n=1)


# ---- refused: ranks on one host that exchange bytes ------------------------------------------------------------

def test_24_ranks_on_16_one_gpu_hosts_are_refused_naming_both_counts():
    w = data_parallel_all_reduce(MIB16)
    with pytest.raises(ReplayError) as e:
        plan_for_simulation(w, topofile.load("dual-plane-16"), ReplayOptions(ranks=24))
    msg = str(e.value)
    # block: ceil(24 / 16) = 2 per host, on h0 .. h11; ranks 0 and 1 (ring neighbours) on h0
    assert "24 ranks on 16 hosts: 2 ranks would share a host (h0: ranks 0, 1; --placement block)" in msg
    assert "between ranks 0 and 1 for free" in msg and "hosts carry 1 GPU each" in msg
    assert "at most 16 ranks" in msg and "at least 24 hosts" in msg


def test_spread_falls_back_to_block_and_is_refused_too():
    w = data_parallel_all_reduce(MIB16)
    with pytest.raises(ReplayError, match="24 ranks on 16 hosts: 2 ranks would share a host"):
        plan_for_simulation(w, topofile.load("pyramid-16"), ReplayOptions(ranks=24, placement="spread"))


def test_on_a_server_fabric_two_ranks_on_one_gpu_are_refused_too():
    # dual-plane-16-servers: 4 servers of 4 GPUs = 16 hosts; 24 ranks put ranks 0 and 1 on h0, one GPU
    fab = topofile.load("dual-plane-16-servers")
    assert fab.gpus_per_server == 4 and len(fab.hosts) == 16
    with pytest.raises(ReplayError) as e:
        plan_for_simulation(data_parallel_all_reduce(MIB16), fab, ReplayOptions(ranks=24))
    assert "24 ranks on 16 hosts: 2 ranks would share a host" in str(e.value)
    assert "servers of 4 GPUs are 4 hosts each" in str(e.value)


def test_a_placement_file_putting_a_communicating_pair_on_one_host_is_refused(tmp_path):
    f = tmp_path / "pair.yaml"
    f.write_text("{0: h0, 1: h0}\n")
    w = one_step(coll("all_reduce", MIB16, (0, 1)), n=2)
    with pytest.raises(ReplayError, match=r"2 ranks on 16 hosts: 2 ranks would share a host \(h0: ranks 0, 1"):
        plan_for_simulation(w, topofile.load("dual-plane-16"), ReplayOptions(placement=str(f)))


def test_cli_refuses_24_ranks_on_16_hosts_with_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "fabriclab.cli", "sim", "builtin", "--ranks", "24", "--topology",
                          "dual-plane-16", "--out", str(tmp_path)], check=False, cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode == 2, res.stderr
    assert "24 ranks on 16 hosts: 2 ranks would share a host" in res.stderr
    assert "Traceback" not in res.stderr


# ---- allowed: in-server transfers at the NVLink rate, and shared hosts that exchange nothing --------------------

def test_all_reduce_between_two_gpus_of_one_server_takes_its_nvlink_time():
    w = one_step(coll("all_reduce", MIB16, (0, 1)), n=2)  # block: h0 and h1, GPUs 0 and 1 of server 0
    res = simulated(w, "in-server", servers_fabric(), "ecmp", ReplayOptions())
    (c,) = res.collectives
    hand_us = 2 * 8_388_608 * 8 / 3.6e12 * 1e6  # 37.2827 us
    assert c.duration_real_us == pytest.approx(hand_us, rel=1e-9)
    assert c.duration_real_us == pytest.approx(37.2827, abs=1e-4)
    assert c.busbw_bps == pytest.approx(NVLINK_GBPS * 1e9, rel=1e-9)  # not the 134,218 Tbit/s of a free pair
    assert sum(l.emu_bytes for l in res.links) == 0  # NVLink, not the fabric
    assert any(n.startswith("in-server: transfers between two GPUs of one server") and "3600 Gbit/s" in n
               for n in res.meta.notes)


def test_send_recv_between_two_gpus_of_one_server_takes_bytes_over_nvlink():
    w = one_step(coll("send_recv", 1_000_000, (0, 1)), n=2)
    res = simulated(w, "in-server", servers_fabric(), "ecmp", ReplayOptions())
    assert res.collectives[0].duration_real_us == pytest.approx(2.2222, abs=1e-4)  # 8e6 / 3.6e12 s


def test_one_gpu_per_server_fabric_has_no_in_server_note():
    w = one_step(coll("all_reduce", MIB16, (0, 1)), n=2)
    plan = plan_for_simulation(w, topofile.load("dual-plane-16"), ReplayOptions())
    assert not any(n.startswith(("in-server", "1 host(s)")) for n in plan.notes)


def test_ranks_sharing_a_host_without_exchanging_bytes_share_its_nic(tmp_path):
    f = tmp_path / "shared.yaml"
    f.write_text("{0: h0, 1: h1, 2: h0, 3: h2}\n")  # ranks 0 and 2 on h0; they never exchange bytes
    w = one_step(coll("send_recv", 1_000_000, (0, 1)), coll("send_recv", 1_000_000, (2, 3), stream="1"), n=4)
    res = simulated(w, "shared", topofile.load("dual-plane-16"), "ecmp", ReplayOptions(placement=str(f)))
    assert any(n.startswith("1 host(s) hold several ranks (e.g. h0: ranks 0, 2)") for n in res.meta.notes)
    # both 1 MB sends leave h0 at once over its 2 x 200G NICs: 200 Gbit/s each, 40 us each (20 us alone)
    assert [c.duration_real_us for c in res.collectives] == [pytest.approx(40.0, rel=1e-9)] * 2
