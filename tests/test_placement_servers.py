"""Whole-server placements (`pods`, `fragmented`): every expected server worked out by hand from the
builder's shape, and every random draw re-made here with the same `random.Random` calls the placement
documents (never read back from the code under test)."""
from __future__ import annotations

import random

import pytest

from fabric import topofile
from fabric.builders import dual_plane, leaf_spine, pyramid
from fabric.transfers import TransferError
from fabriclab import compare as cmp
from tests.test_replay import coll, workload
from traffic.placement import resolve_placement, server_pods
from traffic.reach import host_pods
from traffic.replay import ReplayError, ReplayOptions, plan_replay

# 32 GPUs, 2 per server (16 servers). 4 GPUs per ToR -> 8 ToRs; 2 ToRs per pod -> 4 pods, each with its
# own aggregation switch. ToR t holds h4t..h4t+3, so pod p holds hosts h8p..h8p+7 = servers 4p..4p+3.
G = 2
PYR = pyramid(hosts=32, hosts_per_tor=4, tors_per_pod=2, aggs_per_pod=1, cores=1, gpus_per_server=G,
              nvlink_gbps=3600)
SERVERS = 16
SERVERS_PER_POD = 4


def pod_of_server(s: int) -> int:
    return s // SERVERS_PER_POD


def idx(host: str) -> int:
    return int(host[1:])


def servers_of(placement, g=G) -> list[int]:
    """The job's servers in rank order (one entry per server, as ranks come in runs of G)."""
    return [idx(placement.hosts[r]) // g for r in range(0, len(placement), g)]


def on_servers(servers: list[int], g=G) -> tuple[str, ...]:
    """Rank r on GPU r % g of servers[r // g], by hand: host g*s + gpu."""
    return tuple(f"h{g * servers[r // g] + r % g}" for r in range(g * len(servers)))


def dp_group(n_ranks: int, gpu: int, g=G) -> list[int]:
    """The ranks with GPU index `gpu` in their server (one per server: a DP group under Megatron's order)."""
    return list(range(gpu, n_ranks, g))


def pods_spanned(placement, ranks: list[int]) -> int:
    return len({pod_of_server(idx(placement.hosts[r]) // G) for r in ranks})


def assert_whole_servers(placement, g=G):
    for r in range(0, len(placement), g):
        hosts = placement.hosts[r:r + g]
        assert len({idx(h) // g for h in hosts}) == 1  # the G ranks of a server stay together
        assert [idx(h) % g for h in hosts] == list(range(g))  # rank r is GPU r % G


# ---- the pods of a fabric --------------------------------------------------------------------------

def test_host_pods_follow_the_shared_aggregation_switches():
    assert host_pods(PYR) == {f"h{h}": h // 8 for h in range(32)}
    assert server_pods(PYR) == tuple(tuple(range(4 * p, 4 * p + 4)) for p in range(4))


def test_a_clos_or_mesh_is_one_pod():
    # every leaf under every spine (or linked to every other leaf): nothing between pods but the spines
    for fab in (leaf_spine(hosts=16, hosts_per_leaf=4, spines=2),
                dual_plane(hosts=16, hosts_per_leaf=4, gpus_per_server=2, nvlink_gbps=3600),
                dual_plane(hosts=16, hosts_per_leaf=4, plane_kind="mesh"),
                topofile.load("dual-plane-16-rail")):
        assert set(host_pods(fab).values()) == {0}
        assert server_pods(fab) == (tuple(range(fab.servers)),)


def test_rail_pyramid_pods_are_rail_groups():
    # 8 servers x 4 GPUs, 2 servers per rail group (hosts_per_tor 2): GPU g of server s on ToR (s // 2) * 4 + g;
    # 4 ToRs per pod = the 4 rails of one rail group, so pod p = servers 2p, 2p+1 = hosts h8p..h8p+7
    fab = pyramid(hosts=32, hosts_per_tor=2, tors_per_pod=4, aggs_per_pod=1, cores=1, gpus_per_server=4,
                  nvlink_gbps=3600, wiring="rail")
    assert host_pods(fab) == {f"h{h}": h // 8 for h in range(32)}
    assert server_pods(fab) == ((0, 1), (2, 3), (4, 5), (6, 7))
    # a 4-server job: the first server of each rail group, servers 0, 2, 4, 6
    assert resolve_placement(fab, 16, "pods").hosts == on_servers([0, 2, 4, 6], 4)
    # pyramid-1024-rail: 32 servers per rail group, 8 ToRs (= 8 rails) per pod: pod p = servers 32p..32p+31
    big = topofile.load("pyramid-1024-rail")
    assert server_pods(big) == tuple(tuple(range(32 * p, 32 * p + 32)) for p in range(4))


def test_a_server_across_pods_joins_them():
    # pyramid-16-rail: 4 servers x 4 GPUs, ToR g = rail g, pods = rails 0-1 and rails 2-3: GPU g of every
    # server is in pod g // 2, so every server spans both pods and whole servers see one pod: pods = block
    fab = topofile.load("pyramid-16-rail")
    assert host_pods(fab) == {f"h{h}": (h % 4) // 2 for h in range(16)}
    assert server_pods(fab) == ((0, 1, 2, 3),)
    for n in (4, 8, 16):
        assert resolve_placement(fab, n, "pods") == resolve_placement(fab, n, "block")


# ---- pods ----------------------------------------------------------------------------------------

def test_pods_puts_a_four_server_job_one_server_per_pod():
    n = 4 * G
    pods = resolve_placement(PYR, n, "pods")
    # S = 4 = the 4 pods: the first server of each pod, 0, 4, 8, 12
    assert pods.hosts == ("h0", "h1", "h8", "h9", "h16", "h17", "h24", "h25")
    assert_whole_servers(pods)
    assert all(PYR.same_server(pods.hosts[r], pods.hosts[r + 1]) for r in range(0, n, 2))  # TP pairs in a server
    for gpu in range(G):
        assert pods_spanned(pods, dp_group(n, gpu)) == 4
    block = resolve_placement(PYR, n, "block")
    assert block.hosts == tuple(f"h{h}" for h in range(8))  # as today: servers 0..3, all in pod 0
    for gpu in range(G):
        assert pods_spanned(block, dp_group(n, gpu)) == 1


def test_pods_equal_runs_per_pod_and_fewer_servers_than_pods():
    # 8 servers over 4 pods: 2 per pod, each pod's first two
    assert servers_of(resolve_placement(PYR, 16, "pods")) == [0, 1, 4, 5, 8, 9, 12, 13]
    # 2 servers (< 4 pods): the first 2 pods, one server each
    assert servers_of(resolve_placement(PYR, 4, "pods")) == [0, 4]
    # a single server: server 0
    assert resolve_placement(PYR, 2, "pods").hosts == ("h0", "h1")
    # the whole fabric: block
    assert resolve_placement(PYR, 32, "pods") == resolve_placement(PYR, 32, "block")


def test_pods_on_one_pod_fabrics_is_block():
    for fab in (topofile.load("dual-plane-16"), topofile.load("leaf-spine-16"), topofile.load("dual-plane-16-rail")):
        g = fab.gpus_per_server
        for n in (g, 2 * g, 3 * g, 16):
            assert resolve_placement(fab, n, "pods") == resolve_placement(fab, n, "block")


def test_pods_with_one_gpu_per_server_on_pyramid_16():
    # pyramid-16: G = 1, pods of 8 hosts (h0..h7, h8..h15); 4 ranks: 2 per pod, h0 h1 h8 h9
    fab = topofile.load("pyramid-16")
    assert resolve_placement(fab, 4, "pods").hosts == ("h0", "h1", "h8", "h9")
    # 2 ranks: one per pod, each pod's first host
    assert resolve_placement(fab, 2, "pods").hosts == ("h0", "h8")


def test_spread_strides_gpus_and_breaks_servers():
    # spread: 8 ranks on 32 hosts, one every 4: h0, h4, ..., h28, each alone on its server; pods keeps pairs
    spread = resolve_placement(PYR, 8, "spread")
    assert spread.hosts == tuple(f"h{4 * i}" for i in range(8))
    assert not PYR.same_server(spread.hosts[0], spread.hosts[1])


@pytest.mark.parametrize("n, msg", [
    (3, r"3 ranks are not whole servers of 2 GPUs"),
    (6 * G, r"6 servers \(12 ranks\) do not split evenly over the fabric's 4 pods"),
    (17 * G, r"needs 17 servers \(34 ranks at 2 per server\), the fabric has 16"),
    (0, r"n_ranks must be an integer >= 1"),
])
def test_pods_refuses_what_cannot_be_even(n, msg):
    with pytest.raises(TransferError, match=msg):
        resolve_placement(PYR, n, "pods")


def test_pods_refuses_an_uneven_job_with_one_gpu_per_server():
    with pytest.raises(TransferError, match=r"3 servers \(3 ranks\) do not split evenly over the fabric's 2 pods"):
        resolve_placement(topofile.load("pyramid-16"), 3, "pods")


# ---- fragmented ----------------------------------------------------------------------------------

def redraw(servers: int, taken: int, job: int, seed: int) -> tuple[set[int], list[int]]:
    """The draw as documented, written out here: the occupied servers, then the job's from the free."""
    rng = random.Random(seed)
    occupied = set(rng.sample(range(servers), taken))
    free = [s for s in range(servers) if s not in occupied]
    return occupied, sorted(rng.sample(free, job))


def test_fragmented_defaults_are_half_occupied_and_seed_0():
    _, job = redraw(SERVERS, 8, 4, 0)  # 0.5 x 16 servers = 8 occupied
    expected = on_servers(job)
    for spec in ("fragmented", "fragmented:0.5", "fragmented:0.5:0", "fragmented:.5", "fragmented:0.50:0"):
        assert resolve_placement(PYR, 4 * G, spec).hosts == expected


def test_fragmented_is_seeded_whole_servers_on_free_servers_only():
    for seed in range(6):
        occupied, job = redraw(SERVERS, 8, 4, seed)
        p = resolve_placement(PYR, 4 * G, f"fragmented:0.5:{seed}")
        assert p == resolve_placement(PYR, 4 * G, f"fragmented:0.5:{seed}")  # same seed, same placement
        assert_whole_servers(p)
        assert servers_of(p) == job  # ascending, as drawn here
        assert not set(servers_of(p)) & occupied
    a, b = redraw(SERVERS, 8, 4, 0)[1], redraw(SERVERS, 8, 4, 1)[1]
    assert a != b  # the two seeds draw differently here, so the placements must differ
    assert resolve_placement(PYR, 4 * G, "fragmented:0.5:0") != resolve_placement(PYR, 4 * G, "fragmented:0.5:1")


def test_fragmented_pods_spanned_for_one_seed():
    seed = 3
    _, job = redraw(SERVERS, 8, 4, seed)
    hand_pods = {s // SERVERS_PER_POD for s in job}  # pod p = servers 4p..4p+3 (the builder's shape)
    p = resolve_placement(PYR, 4 * G, f"fragmented:0.5:{seed}")
    for gpu in range(G):
        assert pods_spanned(p, dp_group(4 * G, gpu)) == len(hand_pods)
    assert {host_pods(PYR)[h] for h in p.hosts} == hand_pods


def test_fragmented_takes_exactly_the_free_servers_when_they_just_fit():
    # 0.75 x 16 = 12 occupied; a 4-server job is then the 4 free servers, whatever the second draw
    for seed in (0, 7):
        occupied, _ = redraw(SERVERS, 12, 4, seed)
        free = [s for s in range(SERVERS) if s not in occupied]
        assert len(free) == 4
        assert resolve_placement(PYR, 4 * G, f"fragmented:0.75:{seed}").hosts == on_servers(free)
    with pytest.raises(TransferError, match=r"needs 5 servers \(10 ranks\), 4 are free \(12 of the fabric's 16 "
                                            r"occupied at occupancy 0.75\)"):
        resolve_placement(PYR, 5 * G, "fragmented:0.75")


def test_fragmented_occupancy_is_exact_decimal():
    # 0.29 x 100 is 28.999... in binary floating point; the placement counts 29 occupied servers
    fab = leaf_spine(hosts=100, hosts_per_leaf=4, spines=2)
    occupied, _ = redraw(100, 29, 71, 0)
    assert [idx(h) for h in resolve_placement(fab, 71, "fragmented:0.29").hosts] == \
        [s for s in range(100) if s not in occupied]
    with pytest.raises(TransferError, match=r"needs 72 servers \(72 ranks\), 71 are free"):
        resolve_placement(fab, 72, "fragmented:0.29")


def test_fragmented_with_no_occupancy_draws_from_the_whole_fabric():
    _, job = redraw(SERVERS, 0, 16, 5)
    assert job == list(range(16))
    assert resolve_placement(PYR, 32, "fragmented:0:5") == resolve_placement(PYR, 32, "block")
    _, job = redraw(SERVERS, 0, 3, 5)
    assert servers_of(resolve_placement(PYR, 6, "fragmented:0:5")) == job


@pytest.mark.parametrize("spec, msg", [
    ("fragmented:x", r"occupancy 'x' is not a decimal number in \[0, 1\)"),
    ("fragmented:0.5:1:2", r"3 fields after 'fragmented', at most 2"),
    ("fragmented:", r"occupancy '' is not a decimal"),
    ("fragmented:0.5:", r"seed '' is not an integer"),
    ("fragmented:1", r"occupancy must be in \[0, 1\).*got 1"),
    ("fragmented:1.5", r"occupancy must be in \[0, 1\).*got 1.5"),
    ("fragmented:-0.1", r"occupancy '-0.1' is not a decimal"),
    ("fragmented:nan", r"occupancy 'nan' is not a decimal"),
    ("fragmented:inf", r"occupancy 'inf' is not a decimal"),
    ("fragmented:1/2", r"occupancy '1/2' is not a decimal"),
    ("fragmented:0.5:x", r"seed 'x' is not an integer in 0..2\^63-1"),
    ("fragmented:0.5:-1", r"seed '-1' is not an integer"),
    ("fragmented:0.5:1.5", r"seed '1.5' is not an integer"),
    ("fragmented:0.5:99999999999999999999", r"seed '9+' is not an integer"),
])
def test_hostile_fragmented_specs(spec, msg):
    with pytest.raises(TransferError, match=msg):
        resolve_placement(PYR, 4, spec)
    with pytest.raises(ReplayError, match="--placement: .*" + msg):  # refused before any fabric is at hand
        ReplayOptions(placement=spec).check()


def test_fragmented_needs_whole_servers():
    with pytest.raises(TransferError, match=r"fragmented: 5 ranks are not whole servers of 2 GPUs"):
        resolve_placement(PYR, 5, "fragmented")


def test_a_file_named_like_a_placement_is_still_a_file(tmp_path):
    f = tmp_path / "fragmented.yaml"
    f.write_text("{0: h3, 1: h2}\n")
    assert resolve_placement(PYR, 2, str(f)).hosts == ("h3", "h2")


# ---- wired through -------------------------------------------------------------------------------

def test_the_replay_plan_takes_the_new_placements():
    fab = topofile.load("pyramid-16")  # G = 1: pods h0..h7, h8..h15
    plan = plan_replay(workload([coll(n=4)]), fab, ReplayOptions(placement="pods", dilation=1000))
    assert plan.placement.hosts == ("h0", "h1", "h8", "h9")
    _, job = redraw(16, 8, 4, 2)
    plan = plan_replay(workload([coll(n=4)]), fab, ReplayOptions(placement="fragmented:0.5:2", dilation=1000))
    assert plan.placement.hosts == tuple(f"h{s}" for s in job)


def test_compare_runs_a_fragmented_job_in_a_cluster_whose_free_servers_hold_it():
    from fractions import Fraction

    from traffic.traces import BUILTIN_TRACE

    # the job's size doubled until (1 - occupancy) of it holds the job: 16 at 0.5 -> 32 (16 free);
    # at 0.75 -> 64 (16 free); at 0.3 -> 32 (22.4 free; 16 alone would leave 11.2)
    assert cmp.cluster_gpus(16, Fraction("0.5")) == 32
    assert cmp.cluster_gpus(16, Fraction("0.75")) == 64
    assert cmp.cluster_gpus(16, Fraction("0.3")) == 32
    assert cmp.cluster_gpus(16, Fraction(0)) == 16
    rows = cmp.compare(str(BUILTIN_TRACE), [cmp.Series("pyramid-16", "ecmp")], sizes=[16],
                       options={"placement": "fragmented:0.5"}, jobs=1)
    assert [(r.fabric, r.gpus, r.cluster_gpus) for r in rows] == [("pyramid-32", 16, 32)]

def test_compare_refuses_a_malformed_fragmented_spec_before_running():
    with pytest.raises(ReplayError, match="--placement"):
        cmp.compare("unused-trace", [cmp.Series("pyramid-16", "ecmp")], sizes=[16],
                    options={"placement": "fragmented:0.5:1:2"})
