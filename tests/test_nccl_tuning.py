"""traffic.nccl_tuning against public NCCL logs and against arithmetic done by hand from tuning.cc (NCCL 2.30.7)."""
from __future__ import annotations

import pytest

from traffic.nccl_tuning import (
    ALGORITHMS,
    Graph,
    Machine,
    algo_time_us,
    choose,
    format_table,
    parse_tuning_log,
    tune,
)

# ---------------------------------------------------------------------------------------------------------------
# Log 1 (main validation): NCCL 2.29.7, two ranks on two "nodes" (NCCL_HOSTID differs per rank, so nNodes 2 and
# one GPU per node, i.e. PAT is on), NET/Socket, GeForce RTX 5090 (sm_120 -> Blackwell constants).
# https://github.com/eunomia-bpf/nccl-eBPF/blob/14f9bca8b8a0a6eea21beec714340663b5fcb668/docs/tmp/default-suboptimal-search.md#L144-L171
# ("comm ... rank 0 nRanks 2 nNodes 2 localRanks 1" for that setup: docs/tmp/p2-shm-transport-experiment.md#L116).
# 2.29.7 -> 2.30.7 changed nothing in the Tree/Ring/PAT model: `git diff -w v2.29.7-1 5067397c --
# src/graph/tuning.cc` only touches perChMaxNVLSTreeBws, CollNetChain enabling and the LL128 compcap test.
LOG_2_29_7 = """\
lab:3038984:3038984 [0] NCCL INFO NCCL version 2.29.7+cuda12.9
lab:3038984:3038984 [0] NCCL INFO   Algorithm   |                            Tree                  |                            Ring                  |                   CollNetDirect                  |
lab:3038984:3038984 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
lab:3038984:3038984 [0] NCCL INFO  Max NThreads |            512 |            640 |            512 |            512 |            640 |            256 |              0 |              0 |            640 |
lab:3038984:3038984 [0] NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     9.3/   1.2 |    18.0/   0.0 |    22.4/   2.4 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO        Reduce |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     9.3/   1.2 |    18.0/   0.0 |    22.4/   2.4 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO     AllGather |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |    11.6/   2.4 |    22.5/   0.0 |    22.4/   4.8 |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO ReduceScatter |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |    11.6/   2.4 |    22.5/   0.0 |    22.4/   4.8 |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO     AllReduce |    16.8/   0.5 |    31.0/   0.0 |    36.4/   1.9 |    16.6/   1.2 |    31.0/   0.0 |    36.4/   2.4 |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO   Algorithm   |                    CollNetChain                  |                            NVLS                  |                        NVLSTree                  |
lab:3038984:3038984 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
lab:3038984:3038984 [0] NCCL INFO  Max NThreads |              0 |              0 |            640 |              0 |              0 |            640 |              0 |              0 |            640 |
lab:3038984:3038984 [0] NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO        Reduce |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO     AllGather |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO ReduceScatter |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO     AllReduce |     5.0/   0.0 |     8.5/   0.0 |    14.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO   Algorithm   |                             PAT                  |
lab:3038984:3038984 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
lab:3038984:3038984 [0] NCCL INFO  Max NThreads |              0 |              0 |              0 |
lab:3038984:3038984 [0] NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO        Reduce |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO     AllGather |     0.0/   0.0 |     0.0/   0.0 |    17.6/   3.6 |
lab:3038984:3038984 [0] NCCL INFO ReduceScatter |     0.0/   0.0 |     0.0/   0.0 |    17.6/   3.6 |
lab:3038984:3038984 [0] NCCL INFO     AllReduce |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
lab:3038984:3038984 [0] NCCL INFO Broadcast: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
"""
# The log has no GRAPH lines, so the graphs are inferred from the same log and stated here:
# - nChannels 2: the collectives run on channel{Lo..Hi}={0..3}, i.e. comm->nChannels 4 = 2 x 2 search channels
#   after NCCL's duplication (connect.cc:460; no Hopper+ doubling: ring bwIntra 1.2 <= 45).
# - ring bwIntra 1.2: Broadcast Ring/Simple prints 2 x 1.2 = 2.4 (ratio nRanks/nsteps = 2/2), and Max NThreads
#   Ring/Simple is 256, i.e. ring bwIntra x nChannels <= PCI_BW 12 (tuning.cc:244-245).
# - tree bwIntra 2.4 and Pattern 3 (NCCL_TOPO_PATTERN_TREE, x0.85): AllReduce Tree/Simple prints
#   min(2 x 2.4 x 0.92, 2 x 42.8) x 0.85 x 0.5 = 1.877 ~ 1.9 and PAT (tree graph) 2 x 2.4 x 0.75 = 3.6.
# - type_inter PHB (worse than PXN): LL128 prints bandwidth 0 (tuning.cc:522); socket NICs sit behind the CPU.
# - One GPU per node, so intra-node latencies and the CPU (net overhead) multiply 0 steps; latencyInter 0.
M_2_29_7 = Machine(n_ranks=2, n_nodes=2, cuda_arch=120, cpu="intel")
G_2_29_7 = {"ring": Graph(2, 1.2, 1.2, type_intra="LOC", type_inter="PHB", pattern=4),
            "tree": Graph(2, 2.4, 2.4, type_intra="LOC", type_inter="PHB", pattern=3)}


def _close(mine: float, logged: float) -> bool:
    """Within 5%, or within the print rounding (one decimal) for values near 0."""
    return abs(mine - logged) <= max(0.05 * abs(logged), 0.05 + 1e-9)


def _deviations(table_text: str, machine: Machine, graphs: dict[str, Graph]) -> dict[tuple[str, str, str], float]:
    logged = parse_tuning_log(table_text)
    entries = tune(machine, graphs).entries
    out = {}
    for key, (lat, bw) in logged.items():
        if key[1] not in ALGORITHMS:
            continue  # CollNet / NVLS / NVLSTree are not modelled
        e = entries.get(key)
        mine = (e.latency_us, e.bw_GBps) if e else (0.0, 0.0)
        assert _close(mine[0], lat), f"{key}: latency {mine[0]:.3f} vs logged {lat}"
        assert _close(mine[1], bw), f"{key}: bandwidth {mine[1]:.4f} vs logged {bw}"
        out[key] = max(abs(m - g) / g for m, g in zip(mine, (lat, bw)) if g) if (lat or bw) else 0.0
    return out


def test_public_2_29_7_log_every_tree_ring_pat_entry_within_5_percent():
    dev = _deviations(LOG_2_29_7, M_2_29_7, G_2_29_7)
    assert len(dev) == 5 * 3 * 3  # every collective x {Tree, Ring, PAT} x protocol of the printed table
    assert max(dev.values()) < 0.013  # worst: Tree LL / Simple bandwidth 0.494 / 1.877 vs printed 0.5 / 1.9


def test_format_table_prints_nccl_layout_of_that_log():
    ours = format_table(tune(M_2_29_7, G_2_29_7)).splitlines()
    theirs = [line.split("NCCL INFO ", 1)[1] for line in LOG_2_29_7.splitlines()[1:-1]]
    assert len(ours) == len(theirs) == 24
    # Byte for byte except the rows where NCCL prints CollNetDirect (block 1: AllGather, ReduceScatter,
    # AllReduce) and CollNetChain (block 2: AllReduce) latencies, which are not modelled (we print 0.0/0.0);
    # in those rows the name, Tree and Ring cells still match exactly.
    assert [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b] == [5, 6, 7, 15]
    for i in (5, 6, 7):
        assert ours[i].split("|")[:7] == theirs[i].split("|")[:7]
    logged = parse_tuning_log(LOG_2_29_7)
    round_trip = parse_tuning_log("\n".join(ours))
    assert {k: v for k, v in round_trip.items() if k[1] in ALGORITHMS} == \
        {k: v for k, v in logged.items() if k[1] in ALGORITHMS}


# The same machine's default per-size choices, printed by NCCL as "<Func>: <count*typesize> Bytes -> Algo ...":
# broadcast: default-suboptimal-search.md#L172-L189 ("Broadcast: 16384 Bytes -> Algo RING proto LL",
#   "Broadcast: 32768 Bytes -> Algo RING proto SIMPLE"), nccl-tests -b 1024 -e 128M -f 2.
# all_reduce: .../docs/tmp/p2-default-vs-optimal-sweep.md#L54-L67 ("AllReduce: 65536 Bytes -> Algo RING proto LL",
#   "AllReduce: 131072 Bytes -> Algo RING proto SIMPLE").
# all_gather: .../docs/tmp/p3-allgather-reducescatter-sweep.md#L62-L84 (columns re-aligned by its author):
#   "AllGather: 16384 Bytes -> Algo RING  proto LL", "AllGather: 32768 Bytes -> Algo PAT   proto SIMPLE",
#   "AllGather: 65536 Bytes -> Algo RING  proto SIMPLE". NCCL prints count*typesize = n_bytes / nRanks
#   (enqueue.cc:822-823), so all-gather n_bytes (nccl-tests size) is twice the printed number.
LOGGED_CHOICES = (
    [("broadcast", 2**k, "ring", "LL") for k in range(10, 15)]
    + [("broadcast", 2**k, "ring", "Simple") for k in range(15, 28)]
    + [("all_reduce", n, "ring", "LL") for n in (8, 64, 512, 4096, 16384, 32768, 65536)]
    + [("all_reduce", n, "ring", "Simple") for n in (131072, 262144, 524288, 1 << 20, 1 << 22, 1 << 24, 1 << 27)]
    + [("all_gather", 2 * 2**k, "ring", "LL") for k in range(4, 15)]
    + [("all_gather", 2 * 32768, "pat", "Simple")]
    + [("all_gather", 2 * 2**k, "ring", "Simple") for k in range(16, 27)]
)


@pytest.mark.parametrize(("collective", "n_bytes", "algo", "proto"), LOGGED_CHOICES)
def test_choose_matches_the_logged_default_choices(collective, n_bytes, algo, proto):
    c = choose(tune(M_2_29_7, G_2_29_7), collective, n_bytes)
    assert (c.algo, c.proto) == (algo, proto)


def test_logged_switch_points_worked_by_hand():
    t = tune(M_2_29_7, G_2_29_7)
    # all_reduce 65536 B: Ring/LL 16.6 + 65536/1200 = 71.21; Ring/Simple carries the plateau because
    # 65536 // (4 channels * 2 ranks) = 8192 >= 64 (tuning.cc:647-650): 36.4 * 1.4 + 65536/2400 = 50.96 + 27.31
    # = 78.27, so LL; without the plateau Simple (63.71) would win, contradicting the log.
    assert algo_time_us(t, "all_reduce", "ring", "LL", 65536) == pytest.approx(16.6 + 65536 / 1200)
    assert algo_time_us(t, "all_reduce", "ring", "Simple", 65536) == pytest.approx(36.4 * 1.4 + 65536 / 2400)
    # all_gather 65536 B: PAT 17.6 + 65536/3600 = 35.80 < Ring/Simple 22.4 + 65536/4800 = 36.05 (a 0.7% margin:
    # within the print rounding of the inferred graph bandwidths, so consistent with, not proof of, the log).
    assert algo_time_us(t, "all_gather", "pat", "Simple", 65536) == pytest.approx(17.6 + 65536 / 3600)
    assert algo_time_us(t, "all_gather", "ring", "Simple", 65536) == pytest.approx(22.4 + 65536 / 4800)


# ---------------------------------------------------------------------------------------------------------------
# Log 2 (older NCCL, multi-node H100): https://github.com/NVIDIA/nccl/issues/1519 ("Unable to use multiple NICs"),
# "comm ... rank 0 nRanks 16 nNodes 2 localRanks 8", 8x H100 per node, NICs at PHB distance. The stored copy of the
# issue cuts the AllReduce row after its fifth cell. The NCCL version is not in the excerpt; the values pin it to
# 2.19/2.20: Ring LL = busBw/4 (gone in 2.21.5, commit ab2b89c4) and Tree Simple hwLat 28 (new in 2.19, gone in
# 2.23.4, commit 68b54236). Only entries whose formula and constants are unchanged since then are compared.
LOG_1519 = """\
nathan-h100-1:14492:14605 [0] NCCL INFO   Algorithm   |                            Tree                  |                            Ring                  |                   CollNetDirect                  |
nathan-h100-1:14492:14605 [0] NCCL INFO   Protocol    |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |             LL |          LL128 |         Simple |
nathan-h100-1:14492:14605 [0] NCCL INFO  Max NThreads |            512 |            640 |            512 |            512 |            640 |            512 |              0 |              0 |            640 |
nathan-h100-1:14492:14605 [0] NCCL INFO     Broadcast |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     9.3/   5.0 |    18.0/   0.0 |    22.4/  20.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
nathan-h100-1:14492:14605 [0] NCCL INFO        Reduce |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |     9.3/   5.0 |    18.0/   0.0 |    22.4/  20.0 |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |
nathan-h100-1:14492:14605 [0] NCCL INFO     AllGather |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |    23.3/   5.3 |    44.6/   0.0 |    70.0/  21.3 |     5.6/   0.0 |     5.6/   0.0 |    44.0/   0.0 |
nathan-h100-1:14492:14605 [0] NCCL INFO ReduceScatter |     0.0/   0.0 |     0.0/   0.0 |     0.0/   0.0 |    23.3/   5.3 |    44.6/   0.0 |    70.0/  21.3 |     5.6/   0.0 |     5.6/   0.0 |    44.0/   0.0 |
"""
# The first line (the block header) is not in the stored excerpt; it is the fixed first header of 2.19+
# (tuning.cc:548-555). The cut AllReduce row: "AllReduce |    25.2/   0.0 |    48.5/   0.0 |   448.0/   0.0 |
# 43.4/   2.7 |    79.4".
M_1519 = Machine(n_ranks=16, n_nodes=2, cuda_arch=90, cpu="intel")
# Ring nChannels x bwIntra = 20 (Broadcast Ring/Simple, ratio 16/16); only the product is visible.
G_1519 = {"ring": Graph(2, 10.0, 10.0, "NVL", "PHB", pattern=4), "tree": Graph(2, 10.0, 10.0, "NVL", "PHB")}


def test_issue_1519_h100_two_nodes_version_stable_entries():
    logged = parse_tuning_log(LOG_1519)
    entries = tune(M_1519, G_1519).entries
    stable = [(c, "ring", p) for c in ("broadcast", "reduce", "all_gather", "reduce_scatter")
              for p in ("LL128", "Simple")]
    for key in stable:
        lat, bw = logged[key]
        assert _close(entries[key].latency_us, lat) and _close(entries[key].bw_GBps, bw), key
    for c in ("broadcast", "reduce", "all_gather", "reduce_scatter"):  # Ring/LL latency is stable too
        assert _close(entries[(c, "ring", "LL")].latency_us, logged[(c, "ring", "LL")][0])
    # By hand, 8 GPUs per node, Intel net overhead 1 us (x3 for Simple), ring over NVLink:
    # all_gather LL: 6.6 + (15 - 1) * max(0.6, 1.0) + 1 * 2.7 = 23.3; Simple: 8.4 + 14 * max(3.4, 3.0) + 14 = 70.0
    assert entries[("all_gather", "ring", "LL")].latency_us == pytest.approx(23.3)
    assert entries[("all_gather", "ring", "Simple")].latency_us == pytest.approx(70.0)
    # Tree all_reduce LL / LL128 (cut row: 25.2, 48.5): 6.8 + 2 * (7 * 0.6 + 1 * 5.0), 14 + 2 * (7 * 1.25 + 8.5)
    assert entries[("all_reduce", "tree", "LL")].latency_us == pytest.approx(25.2)
    assert entries[("all_reduce", "tree", "LL128")].latency_us == pytest.approx(48.5)


def test_issue_1519_known_version_differences():
    entries = tune(M_1519, G_1519).entries
    # Ring/LL bandwidth: <= 2.20 used busBw / 4 for multi-node (v2.20.5-1 tuning.cc:181): 20 / 4 = 5.0 printed;
    # 2.30.7 uses busBw * .5 (tuning.cc:327): 10.0.
    assert parse_tuning_log(LOG_1519)[("broadcast", "ring", "LL")] == (9.3, 5.0)
    assert entries[("broadcast", "ring", "LL")].bw_GBps == pytest.approx(10.0)
    # all_reduce Ring/LL latency: <= 2.22 counted 2 * nNodes network steps (v2.20.5-1 tuning.cc:162):
    # 6.6 + (30 - 4) * 1.0 + 4 * 2.7 = 43.4 printed; 2.30.7 counts 2 * (nNodes - 1): 6.6 + 28 * 1.0 + 2 * 2.7 = 40.0.
    assert 6.6 + 26 * 1.0 + 4 * 2.7 == pytest.approx(43.4)
    assert entries[("all_reduce", "ring", "LL")].latency_us == pytest.approx(40.0)
    # Tree/Simple latency: 2.19-2.22 had base 0 and hwLat 28 (v2.20.5-1 tuning.cc:57,67,75):
    # 0 + 2 * (7 * 28 + 1 * 28) = 448.0 printed; 2.30.7: 8.4 + 2 * (7 * 4.0 + 1 * 14.0) = 92.4.
    assert 2 * (7 * 28 + 1 * 28) == 448
    assert entries[("all_reduce", "tree", "Simple")].latency_us == pytest.approx(92.4)


# ---------------------------------------------------------------------------------------------------------------
# Hand-worked: DGX-H100-like nodes, 8 GPUs each, Intel CPUs, both graphs "Pattern 4/1, nChannels 8, bw 48/48,
# type NVL/PXN". comm->nChannels = 2 * 8 = 16 (connect.cc:460; not < 16, so no Hopper doubling).
def _dgx(n_nodes: int):
    graphs = {"ring": Graph(8, 48.0, 48.0, "NVL", "PXN", pattern=4),
              "tree": Graph(8, 48.0, 48.0, "NVL", "PXN", pattern=1)}
    return tune(Machine(8 * n_nodes, n_nodes), graphs)


def test_ring_all_reduce_latency_16_nodes_by_hand():
    t = _dgx(16)
    # nRanks 128: nsteps = 2 * 127 = 254, network steps = 2 * (16 - 1) = 30, intra steps 224 (tuning.cc:289,411).
    # Intra latency = max(NVLink ring latency, net overhead 1.0 x (3 for Simple)) (tuning.cc:405-410).
    # LL:     6.6 + 224 * max(0.6, 1.0) + 30 * 2.7  = 6.6 + 224 + 81      = 311.6
    # LL128: 14.0 + 224 * max(1.9, 1.0) + 30 * 4.0  = 14 + 425.6 + 120    = 559.6
    # Simple: 8.4 + 224 * max(3.4, 3.0) + 30 * 14.0 = 8.4 + 761.6 + 420  = 1190.0
    for proto, expected in (("LL", 311.6), ("LL128", 559.6), ("Simple", 1190.0)):
        assert t.entries[("all_reduce", "ring", proto)].latency_us == pytest.approx(expected)
    assert t.comm_channels == 16
    # Plateau: >= 64 * 16 channels * 128 ranks = 131072 B multiplies the Simple latency by 1.4 (sm >= 80).
    # Ring/Simple bandwidth: 8 * 48 = 384 bus GB/s x 128/254 = 193.51 algorithm GB/s.
    assert algo_time_us(t, "all_reduce", "ring", "Simple", 131071) == pytest.approx(1190.0 + 131071 / 193511.8, 1e-6)
    assert algo_time_us(t, "all_reduce", "ring", "Simple", 131072) == pytest.approx(1666.0 + 131072 / 193511.8, 1e-6)


def test_tree_vs_ring_choice_by_hand():
    # (1) 16 nodes, 1 MiB: tree wins with LL128. logSize = log2(2^20 >> 6) = 14, corrections LL .5, LL128 .6,
    #     Simple .5 (tuning.cc:624-626). 3+ nodes: perChMaxTreeBw 36.0, perChMaxTreeLL128Bw 29.0, llMaxBw 20.4.
    #     Tree busBw = min(384 * .92, 8 * 36) = 288; LL128 min(288 * 120/128, 8 * 29) = 232 -> x.5 = 116 GB/s.
    #     Tree/LL128 latency 14 + 2 * (7 * 1.25 + log2(16) * 8.5) = 99.5 -> 99.5 + 2^20 / (1000 * 116 * .6) = 114.57
    #     Tree/Simple: 8.4 + 2 * (7 * 4 + 4 * 14) = 176.4 + 2^20 / (1000 * 144 * .5) = 190.96
    #     Ring/LL: 311.6 + 2^20 / (1000 * 20.4 * 128/254) = 413.60; Ring/LL128 559.6 + 2^20/147956 = 566.69
    c = choose(_dgx(16), "all_reduce", 1 << 20)
    assert (c.algo, c.proto) == ("tree", "LL128") and c.time_us == pytest.approx(99.5 + 2**20 / 69600)
    assert c.times[("tree", "Simple")] == pytest.approx(176.4 + 2**20 / 72000)
    # (2) 2 nodes, 256 MiB: ring wins with Simple. Ring/Simple 384 * 16/30 = 204.8 GB/s, latency
    #     8.4 + 28 * 3.4 + 2 * 14 = 131.6, x1.4 plateau = 184.24 -> 184.24 + 2^28 / 204800 = 1494.96.
    #     Tree (2 nodes: perChMaxTreeBw 41.4): min(353.28, 331.2) * .5 = 165.6 GB/s, logSize 22 -> Simple .9:
    #     92.4 + 2^28 / (1000 * 165.6 * .9) = 1893.50; Tree/LL128 min(331.2 * .9375, 8 * 36.7) * .5 = 146.8 GB/s,
    #     correction 1.0: 48.5 + 2^28 / 146800 = 1877.08.
    c = choose(_dgx(2), "all_reduce", 1 << 28)
    assert (c.algo, c.proto) == ("ring", "Simple") and c.time_us == pytest.approx(131.6 * 1.4 + 2**28 / 204800)
    assert c.times[("tree", "LL128")] == pytest.approx(48.5 + 2**28 / 146800)
    # (3) 2 nodes, 4 KiB: tree wins with LL. Tree/LL min(331.2 / 3.8, llMaxBw 39.0) * .5 = 19.5 GB/s,
    #     logSize 6 -> LL correction .7: 25.2 + 4096 / (1000 * 19.5 * .7) = 25.50.
    #     Ring/LL: min(39.0, 192) * 16/30 = 20.8 GB/s, latency 6.6 + 28 * 1.0 + 2 * 2.7 = 40.0 -> 40.197.
    c = choose(_dgx(2), "all_reduce", 4096)
    assert (c.algo, c.proto) == ("tree", "LL") and c.time_us == pytest.approx(25.2 + 4096 / 13650)
    assert c.times[("ring", "LL")] == pytest.approx(40.0 + 4096 / 20800)


def test_pat_only_with_one_gpu_per_node():
    graphs = {"ring": Graph(8, 48.0, 48.0), "tree": Graph(8, 48.0, 48.0)}
    one_per_node = tune(Machine(16, 16), graphs).entries
    pat = {k for k in one_per_node if k[1] == "pat"}
    assert pat == {("all_gather", "pat", "Simple"), ("reduce_scatter", "pat", "Simple")}
    # PAT latency 8 + log2(16) * 14 / 3.5 + 16 * 2.8 = 68.8 (tuning.cc:430-433, interLat of the Tree row as ppn 1)
    assert one_per_node[("all_gather", "pat", "Simple")].latency_us == pytest.approx(68.8)
    assert not any(k[1] == "pat" for k in tune(Machine(128, 16), graphs).entries)
    assert not any(k[1] == "pat" for k in tune(Machine(16, 16, net_offload=True), graphs).entries)
    assert not any(k[1] == "tree" and k[0] != "all_reduce" for k in one_per_node)


def test_time_conventions():
    t = _dgx(2)
    # nccl-tests size == NCCL nBytes (all_gather: the whole output); disabled -> -1 (tuning.cc:635-637)
    assert algo_time_us(t, "all_gather", "ring", "Simple", 16 * 1024) == pytest.approx(
        t.entries[("all_gather", "ring", "Simple")].latency_us + 16 * 1024 / (1000 * 384 * 16 / 15))
    assert algo_time_us(t, "all_gather", "tree", "Simple", 1024) == -1.0
    assert algo_time_us(t, "all_gather", "pat", "Simple", 1024) == -1.0
    # aggregated operations: ring pays the latency per op, others per batch of 8 (tuning.cc:652)
    ring1 = algo_time_us(t, "all_reduce", "ring", "LL", 4096)
    assert algo_time_us(t, "all_reduce", "ring", "LL", 4096, num_pipe_ops=3) == pytest.approx(ring1 + 2 * 40.0)
    tree1 = algo_time_us(t, "all_reduce", "tree", "LL", 4096)
    assert algo_time_us(t, "all_reduce", "tree", "LL", 4096, num_pipe_ops=8) == pytest.approx(tree1)
    assert algo_time_us(t, "all_reduce", "tree", "LL", 4096, num_pipe_ops=9) == pytest.approx(tree1 + 25.2)
    single = tune(Machine(1, 1), {"ring": Graph(1, 20.0, 20.0), "tree": Graph(1, 20.0, 20.0)})
    assert not single.entries and choose(single, "all_reduce", 1 << 20).time_us == 0.0


def test_ll128_enable_rules():
    graphs = {"ring": Graph(8, 48.0, 48.0, "NVL", "PHB"), "tree": Graph(8, 48.0, 48.0, "NVL", "PXN")}
    e = tune(Machine(16, 2), graphs).entries
    assert e[("all_reduce", "ring", "LL128")].bw_GBps == 0.0  # PHB is worse than PXN (tuning.cc:522)
    assert e[("all_reduce", "tree", "LL128")].bw_GBps > 0
    assert tune(Machine(16, 2, cuda_arch=80), graphs).entries[("all_reduce", "tree", "LL128")].bw_GBps == 0.0


@pytest.mark.parametrize("make", [
    lambda: Machine(10, 3), lambda: Machine(4, 8), lambda: Machine(0, 1), lambda: Machine(8, 2, cpu="sparc"),
    lambda: Machine(8, 2, cuda_arch=9), lambda: Graph(0, 1.0, 1.0), lambda: Graph(1, 0.0, 1.0),
    lambda: Graph(1, 1.0, float("nan")), lambda: Graph(1, 1.0, 1.0, type_inter="IB"),
    lambda: Graph(1, 1.0, 1.0, pattern=9), lambda: tune(Machine(8, 1), {"ring": Graph(1, 1.0, 1.0)}),
    lambda: tune(Machine(8, 1), {"ring": Graph(1, 1.0, 1.0), "tree": Graph(1, 1.0, 1.0)}, comm_channels=0),
    lambda: algo_time_us(_dgx(2), "allreduce", "ring", "LL", 8),
    lambda: algo_time_us(_dgx(2), "all_reduce", "nvls", "Simple", 8),
    lambda: algo_time_us(_dgx(2), "all_reduce", "ring", "LL", -1),
    lambda: choose(_dgx(2), "all_reduce", 8, algos=("collnet",)),
    lambda: choose(_dgx(2), "broadcast", 8, algos=("tree",)),  # nothing enabled
])
def test_invalid_inputs_raise(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize(("text", "message"), [
    ("", "no NCCL tuning table"),
    ("NCCL INFO hello\nNCCL INFO world", "no NCCL tuning table"),
    ("  Protocol    |  LL |", "before any 'Algorithm' header"),
    ("  Algorithm   |   Tree   | Bogus |", "unknown algorithm"),
    ("  Algorithm   |   Tree   |\n    Broadcast |  1.0/ 2.0 |", "has 1 cells, expected 3"),
    ("  Algorithm   |   Tree   |\n    Broadcast |  1.0/ 2.0 | x | 1.0/1.0 |", "is not 'latency/bandwidth'"),
    (("  Algorithm   |   PAT   |\n    AllReduce |  0.0/0.0 | 0.0/0.0 | 1.0/1.0 |\n"
      "  Algorithm   |   PAT   |\n    AllReduce |  0.0/0.0 | 0.0/0.0 | 2.0/1.0 |"), "several different tables"),
])
def test_parse_tuning_log_rejects_malformed_input(text, message):
    with pytest.raises(ValueError, match=message):
        parse_tuning_log(text)
