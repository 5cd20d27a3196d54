"""Collectives as transfer DAGs: bytes per pair and phase, dependencies, totals, placement.

Every expected value is worked out by hand in the test (comment or literal table)."""
from __future__ import annotations

from collections import defaultdict

import pytest

from fabric.transfers import Placement, TransferDag, TransferError
from traffic.collectives import ALGORITHMS, double_binary_trees, schedule, split_bytes
from traffic.placement import block_placement, groups_by, placement_from_file
from traffic.workload import KINDS


def by_phase(dag: TransferDag) -> dict[int, dict[tuple[int, int], int]]:
    """phase -> (src, dst) -> bytes."""
    out: dict[int, dict[tuple[int, int], int]] = defaultdict(lambda: defaultdict(int))
    for t in dag.transfers:
        out[t.phase][(t.src, t.dst)] += t.size_bytes
    return {p: dict(v) for p, v in out.items()}


def sent_received(dag: TransferDag) -> tuple[dict[int, int], dict[int, int]]:
    sent = {r: 0 for r in dag.ranks}
    recv = {r: 0 for r in dag.ranks}
    for t in dag.transfers:
        sent[t.src] += t.size_bytes
        recv[t.dst] += t.size_bytes
    return sent, recv


def dep_keys(dag: TransferDag, i: int) -> set[tuple[int, int, int]]:
    """The dependencies of transfer i as (src, dst, phase)."""
    return {(dag.transfers[d].src, dag.transfers[d].dst, dag.transfers[d].phase) for d in dag.transfers[i].deps}


def index_of(dag: TransferDag) -> dict[tuple[int, int, int], int]:
    out = {(t.src, t.dst, t.phase): i for i, t in enumerate(dag.transfers)}
    assert len(out) == len(dag), "(src, dst, phase) should identify a transfer here"
    return out


# --- split ----------------------------------------------------------------------------------------------

def test_split_bytes_differs_by_at_most_one_and_sums():
    assert split_bytes(10, 4) == (3, 3, 2, 2)  # 10 = 4 x 2 + 2: the first two pieces carry a byte more
    assert split_bytes(4000, 4) == (1000, 1000, 1000, 1000)
    assert split_bytes(2, 4) == (1, 1, 0, 0)
    with pytest.raises(TransferError, match="0 parts"):
        split_bytes(10, 0)


# --- ring all-reduce --------------------------------------------------------------------------------------

def test_ring_all_reduce_4_ranks_bytes_per_phase_and_pair():
    dag = schedule("all_reduce", 4000, [0, 1, 2, 3], "ring")
    # 2(n-1) = 6 phases (3 reduce-scatter, 3 all-gather); in each, r -> r+1 sends S/n = 1000 B
    ring_step = {(0, 1): 1000, (1, 2): 1000, (2, 3): 1000, (3, 0): 1000}
    assert by_phase(dag) == {k: ring_step for k in range(6)}
    assert dag.bytes_between() == {(0, 1): 6000, (1, 2): 6000, (2, 3): 6000, (3, 0): 6000}
    assert dag.total_bytes == 2 * 3 * 4000


def test_ring_all_reduce_dependency_chains():
    dag = schedule("all_reduce", 4000, [0, 1, 2, 3], "ring")
    at = index_of(dag)
    for r in range(4):
        nxt, prv = (r + 1) % 4, (r - 1) % 4
        assert dag.transfers[at[(r, nxt, 0)]].deps == ()  # step 0 sends the rank's own data
        for k in range(1, 6):
            # step k forwards what arrived from r-1 at step k-1, after r's own step k-1 send (same connection)
            assert dep_keys(dag, at[(r, nxt, k)]) == {(prv, r, k - 1), (r, nxt, k - 1)}


def test_ring_all_reduce_uneven_size_exact():
    # S = 10 over 4 ranks: chunks c = (3, 3, 2, 2). Reduce-scatter step k: q sends chunk q-k-1, so over
    # the 3 steps q sends every chunk but c_q; all-gather step k: q sends chunk q-k: every chunk but
    # c_{q+1}. Sent: rank 0: 7 + 7 = 14, rank 1: 7 + 8 = 15, rank 2: 8 + 8 = 16, rank 3: 8 + 7 = 15.
    dag = schedule("all_reduce", 10, [0, 1, 2, 3], "ring")
    sent, recv = sent_received(dag)
    assert sent == {0: 14, 1: 15, 2: 16, 3: 15}
    assert dag.total_bytes == 60  # 2 (n-1) S = 2 x 3 x 10
    # phase 0 (q sends chunk q-1): 0 -> 1 c3 = 2, 1 -> 2 c0 = 3, 2 -> 3 c1 = 3, 3 -> 0 c2 = 2
    assert by_phase(dag)[0] == {(0, 1): 2, (1, 2): 3, (2, 3): 3, (3, 0): 2}
    assert all(sum(v.values()) == 10 for v in by_phase(dag).values())  # every step moves each chunk once


def test_ring_follows_the_given_rank_order():
    dag = schedule("all_reduce", 300, [5, 9, 7], "ring")
    assert set(dag.bytes_between()) == {(5, 9), (9, 7), (7, 5)}
    assert dag.ranks == (5, 9, 7)


# --- halving-doubling ---------------------------------------------------------------------------------

def test_halving_doubling_8_ranks_per_phase():
    S = 8000
    dag = schedule("all_reduce", S, list(range(8)), "halving_doubling")
    # halving: partner r^4 with S/2, r^2 with S/4, r^1 with S/8; doubling back: r^1 S/8, r^2 S/4, r^4 S/2
    expected = {
        0: {(r, r ^ 4): 4000 for r in range(8)},
        1: {(r, r ^ 2): 2000 for r in range(8)},
        2: {(r, r ^ 1): 1000 for r in range(8)},
        3: {(r, r ^ 1): 1000 for r in range(8)},
        4: {(r, r ^ 2): 2000 for r in range(8)},
        5: {(r, r ^ 4): 4000 for r in range(8)},
    }
    assert by_phase(dag) == expected
    assert dag.total_bytes == 8 * 2 * (4000 + 2000 + 1000) == 2 * 7 * S
    at = index_of(dag)
    # the buffer accumulates: rank 0's phase-2 send waits for everything it received before
    assert dep_keys(dag, at[(0, 1, 2)]) == {(4, 0, 0), (2, 0, 1)}
    # ... and its phase-5 send to 4 also follows its phase-0 send over the same connection
    assert dep_keys(dag, at[(0, 4, 5)]) == {(4, 0, 0), (2, 0, 1), (1, 0, 2), (1, 0, 3), (2, 0, 4), (0, 4, 0)}


def test_halving_doubling_6_ranks_uses_pre_and_post_steps():
    S = 600
    dag = schedule("all_reduce", S, list(range(6)), "halving_doubling")
    # p = 4, r = 2: 0 -> 1 and 2 -> 3 fold whole buffers; active ranks 1, 3, 4, 5 (positions 0..3),
    # chunks of 150 B; halving: pos q^2 (1<->4, 3<->5) 300 B, then q^1 (1<->3, 4<->5) 150 B; doubling back.
    expected = {
        0: {(0, 1): 600, (2, 3): 600},
        1: {(1, 4): 300, (4, 1): 300, (3, 5): 300, (5, 3): 300},
        2: {(1, 3): 150, (3, 1): 150, (4, 5): 150, (5, 4): 150},
        3: {(1, 3): 150, (3, 1): 150, (4, 5): 150, (5, 4): 150},
        4: {(1, 4): 300, (4, 1): 300, (3, 5): 300, (5, 3): 300},
        5: {(1, 0): 600, (3, 2): 600},
    }
    assert by_phase(dag) == expected
    assert dag.total_bytes == 2 * 5 * S  # 1200 + 1200 + 600 + 600 + 1200 + 1200
    at = index_of(dag)
    assert (0, 1, 0) in dep_keys(dag, at[(1, 4, 1)])  # the active rank forwards the folded buffer
    assert dep_keys(dag, at[(1, 0, 5)]) >= {(4, 1, 4), (3, 1, 3)}  # and returns the finished result


# --- double binary tree -------------------------------------------------------------------------------

def test_double_binary_tree_shape_8_ranks():
    a, b = double_binary_trees(list(range(8)))
    # tree A: 0 -> 4; 4 -> 2, 6; 2 -> 1, 3; 6 -> 5, 7 (odd ranks are leaves)
    assert a == {0: (4,), 4: (2, 6), 2: (1, 3), 1: (), 3: (), 6: (5, 7), 5: (), 7: ()}
    # tree B: the mirror, position p holds rank 7-p: 7 -> 3; 3 -> 5, 1; 5 -> 6, 4; 1 -> 2, 0
    assert b == {7: (3,), 3: (5, 1), 5: (6, 4), 6: (), 4: (), 1: (2, 0), 2: (), 0: ()}


def test_tree_all_reduce_8_ranks_bytes_per_rank_and_pair():
    S = 8000
    dag = schedule("all_reduce", S, list(range(8)), "tree")
    # each tree carries h = S/2 = 4000 up every edge and back down. Per rank, sent = h x (children
    # + 1 if not root) per tree: rank 0: A root, 1 child (h) + B leaf (h) = 8000; rank 7 likewise
    # (A leaf, B root with 1 child); ranks 1..6 are inner with 2 children in one tree (3h) and
    # leaves in the other (h): 16000.
    sent, recv = sent_received(dag)
    hand = {0: 8000, 1: 16000, 2: 16000, 3: 16000, 4: 16000, 5: 16000, 6: 16000, 7: 8000}
    assert sent == hand
    assert recv == hand
    edges_a = [(0, 4), (4, 2), (4, 6), (2, 1), (2, 3), (6, 5), (6, 7)]
    edges_b = [(7, 3), (3, 5), (3, 1), (5, 6), (5, 4), (1, 2), (1, 0)]
    pairs: dict[tuple[int, int], int] = defaultdict(int)
    for x, y in edges_a + edges_b:
        pairs[(x, y)] += 4000
        pairs[(y, x)] += 4000  # {1, 2} is an edge of both trees: 8000 each way
    assert dag.bytes_between() == dict(pairs)
    assert dag.total_bytes == 2 * 7 * S


def test_tree_steady_state_flows_tokens_and_phases_8_ranks():
    dag = schedule("all_reduce", 8000, list(range(8)), "tree")
    # tree A (0 -> 4; 4 -> 2, 6; 2 -> 1, 3; 6 -> 5, 7) is added first: 7 edges x (up flow, up token, down flow,
    # down token) = 28 transfers; tree B the next 28
    assert len(dag) == 56
    a = dag.transfers[:28]
    at = {(t.src, t.dst, t.phase, t.size_bytes): i for i, t in enumerate(a)}
    assert len(at) == 28

    def deps(src: int, dst: int, phase: int, size: int) -> set[tuple[int, int, int, int]]:
        t = a[at[(src, dst, phase, size)]]
        return {(a[d].src, a[d].dst, a[d].phase, a[d].size_bytes) for d in t.deps}

    edges = [(0, 4), (4, 2), (4, 6), (2, 1), (2, 3), (6, 5), (6, 7)]
    # bulk up: every child sends its half (4000 B) to its parent at once, phase 0, after nothing
    for p, c in edges:
        assert deps(c, p, 0, 4000) == set()
    # the fill: 0-byte tokens climb by height (leaves 0: phase 1; 2 and 6: 2; 4: 3), each after its children's
    assert deps(1, 2, 1, 0) == set()
    assert deps(2, 4, 2, 0) == {(1, 2, 1, 0), (3, 2, 1, 0)}
    assert deps(4, 0, 3, 0) == {(2, 4, 2, 0), (6, 4, 2, 0)}
    # bulk down at phase 1 + (height 3 + 1) = 5, all after the token reached the root
    for p, c in edges:
        assert deps(p, c, 5, 4000) == {(4, 0, 3, 0)}
    # the drain: tokens descend by depth (0 -> 4 at 6, 4 -> 2 at 7, 2 -> 1 at 8), each behind its edge's down flow
    assert deps(0, 4, 6, 0) == {(4, 0, 3, 0), (0, 4, 5, 4000)}
    assert deps(4, 2, 7, 0) == {(0, 4, 6, 0), (4, 2, 5, 4000)}
    assert deps(2, 1, 8, 0) == {(4, 2, 7, 0), (2, 1, 5, 4000)}
    assert dag.phases() == 9


def test_tree_on_servers_chains_each_server_from_the_nic_s_gpu():
    # 3 servers of 2 GPUs: (0, 1), (2, 3), (4, 5). NIC j of a server is its j-th GPU's: per NIC 2 trees over the
    # 3 servers, each carrying a quarter (S/4). Tree A over servers 0 -> 2 -> 1 (n = 3: positions 0 -> 2; 2 -> 1),
    # tree B shifted (position p holds server p+1 mod 3): 1 -> 0 -> 2. Server edges join GPU j to GPU j (rail j);
    # inside a server the chain of NIC 0 is GPU 0 -> GPU 1 and of NIC 1 GPU 1 -> GPU 0.
    S = 4000
    dag = schedule("all_reduce", S, list(range(6)), "tree", servers=[(0, 1), (2, 3), (4, 5)])
    bulk = [t for t in dag.transfers if t.size_bytes]
    assert {t.size_bytes for t in bulk} == {S // 4}
    across = [(t.src, t.dst) for t in bulk if t.src // 2 != t.dst // 2]
    assert all(a % 2 == b % 2 for a, b in across)  # rail to rail
    # per NIC and tree 2 server edges up and down (4 flows), 4 trees: 16 flows between servers
    assert len(across) == 16
    # inside: each of 3 servers, per NIC and tree, one NVLink hop up and one down: 3 x 2 x 4 = 24
    assert len(bulk) - len(across) == 24
    # rail 0, tree A (servers 0 -> 2 -> 1): GPU 4 <-> GPU 0 and GPU 2 <-> GPU 4
    assert {(0, 4), (4, 0), (4, 2), (2, 4)} <= set(across)


def test_tree_odd_ranks_shifted_second_tree():
    a, b = double_binary_trees([0, 1, 2, 3, 4])
    # n = 5, tree A over positions: 0 -> 4; 4 -> 2; 2 -> 1, 3. Tree B: position p holds rank p+1 mod 5
    assert a == {0: (4,), 4: (2,), 2: (1, 3), 1: (), 3: ()}
    assert b == {1: (0,), 0: (3,), 3: (2, 4), 2: (), 4: ()}
    dag = schedule("all_reduce", 1001, list(range(5)), "tree")
    assert dag.total_bytes == 2 * 4 * 1001  # halves 501 + 500, each up and down 4 edges


# --- hierarchical -------------------------------------------------------------------------------------

def test_hierarchical_2_groups_of_4():
    S = 8000
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    dag = schedule("all_reduce", S, list(range(8)), "hierarchical", groups=groups)
    intra = {(0, 1): 2000, (1, 2): 2000, (2, 3): 2000, (3, 0): 2000,
             (4, 5): 2000, (5, 6): 2000, (6, 7): 2000, (7, 4): 2000}  # ring in each group, S/4
    inter = {(j, j + 4): 1000 for j in range(4)} | {(j + 4, j): 1000 for j in range(4)}  # (S/4)/2
    # phases 0-2 reduce-scatter in groups; 3 (reduce-scatter) and 4 (all-gather) across groups; 5-7 all-gather
    assert by_phase(dag) == {0: intra, 1: intra, 2: intra, 3: inter, 4: inter, 5: intra, 6: intra, 7: intra}
    assert dag.bytes_between()[(0, 1)] == 6 * 2000
    assert dag.bytes_between()[(0, 4)] == 2 * 1000
    assert dag.total_bytes == 8 * 6 * 2000 + 8 * 2 * 1000 == 2 * 7 * S
    at = index_of(dag)
    # rank 1 owns chunk 1 after its last reduce-scatter receive (from 0, phase 2) and sends it across
    assert dep_keys(dag, at[(1, 5, 3)]) == {(0, 1, 2)}
    # and starts the in-group all-gather once chunk 1 came back across: after its cross-group
    # reduce-scatter receive (phase 3) and all-gather receive (phase 4), and after its phase-2 send to 2
    assert dep_keys(dag, at[(1, 2, 5)]) == {(5, 1, 3), (5, 1, 4), (1, 2, 2)}


def test_auto_picks_hierarchical_only_for_equal_groups_of_several_ranks():
    ranks = list(range(8))
    assert "hierarchical" in schedule("all_reduce", 800, ranks, groups=[[0, 1, 2, 3], [4, 5, 6, 7]]).label
    assert "ring" in schedule("all_reduce", 800, ranks, groups=[ranks]).label
    assert "ring" in schedule("all_reduce", 800, ranks, groups=[[r] for r in ranks]).label
    assert "ring" in schedule("all_reduce", 800, ranks, groups=[[0, 1, 2], [3, 4, 5, 6, 7]]).label
    assert "ring" in schedule("all_reduce", 800, ranks).label


def test_groups_are_restricted_to_the_collectives_ranks():
    # the job's groups are 0-3 and 4-7; a collective over 0, 1, 4, 5 uses [0, 1] and [4, 5]
    dag = schedule("all_reduce", 400, [0, 1, 4, 5], "hierarchical", groups=[[0, 1, 2, 3], [4, 5, 6, 7]])
    assert by_phase(dag)[0] == {(0, 1): 200, (1, 0): 200, (4, 5): 200, (5, 4): 200}
    assert by_phase(dag)[1] == {(0, 4): 100, (4, 0): 100, (1, 5): 100, (5, 1): 100}


def test_hierarchical_errors():
    with pytest.raises(TransferError, match="equal size"):
        schedule("all_reduce", 800, list(range(5)), "hierarchical", groups=[[0, 1], [2, 3, 4]])
    with pytest.raises(TransferError, match="needs groups"):
        schedule("all_reduce", 800, list(range(4)), "hierarchical")
    with pytest.raises(TransferError, match=r"ranks \[3\] are in no group"):
        schedule("all_reduce", 800, list(range(4)), groups=[[0, 1], [2]])


# --- other kinds --------------------------------------------------------------------------------------

def test_all_to_all_pairwise_rounds_are_permutations_after_the_round_before():
    dag = schedule("all_to_all", 4000, [0, 1, 2, 3])  # auto: pairwise
    assert dag.bytes_between() == {(i, j): 1000 for i in range(4) for j in range(4) if i != j}
    # by hand: round k (phase k-1) is q -> q+k for every q; a permutation (each rank receives once)
    assert by_phase(dag) == {0: {(0, 1): 1000, (1, 2): 1000, (2, 3): 1000, (3, 0): 1000},
                             1: {(0, 2): 1000, (1, 3): 1000, (2, 0): 1000, (3, 1): 1000},
                             2: {(0, 3): 1000, (1, 0): 1000, (2, 1): 1000, (3, 2): 1000}}
    # rank 0's round-2 send (0 -> 2) waits for its round-1 receive (3 -> 0)
    t = dag.transfers
    send02 = next(i for i, x in enumerate(t) if (x.src, x.dst) == (0, 2))
    recv30 = next(i for i, x in enumerate(t) if (x.src, x.dst) == (3, 0))
    assert t[send02].deps == (recv30,)
    assert all(x.deps == () for x in t if x.phase == 0)


def test_all_to_all_every_ordered_pair_gets_a_quarter():
    dag = schedule("all_to_all", 4000, [0, 1, 2, 3], "direct")
    assert dag.bytes_between() == {(i, j): 1000 for i in range(4) for j in range(4) if i != j}
    assert all(t.deps == () for t in dag.transfers)  # one group: all at once
    assert all(t.phase == (t.dst - t.src) % 4 - 1 for t in dag.transfers)  # phase k-1 labels shift k
    # uneven: S = 10, pieces (3, 3, 2, 2); piece j goes to rank j
    sent, recv = sent_received(schedule("all_to_all", 10, [0, 1, 2, 3], "direct"))
    assert sent == {0: 7, 1: 7, 2: 8, 3: 8}  # 10 minus the piece it keeps
    assert recv == {0: 9, 1: 9, 2: 6, 3: 6}  # its piece from each of the 3 others


def test_all_gather_and_reduce_scatter_ring():
    ag = schedule("all_gather", 4000, [0, 1, 2, 3])
    rs = schedule("reduce_scatter", 4000, [0, 1, 2, 3])
    step = {(0, 1): 1000, (1, 2): 1000, (2, 3): 1000, (3, 0): 1000}
    assert by_phase(ag) == {0: step, 1: step, 2: step}
    assert by_phase(rs) == {0: step, 1: step, 2: step}
    # all-gather of S = 10, chunks (3, 3, 2, 2): rank q sends every chunk but c_{q+1} (step k: chunk q-k)
    sent, _ = sent_received(schedule("all_gather", 10, [0, 1, 2, 3]))
    assert sent == {0: 7, 1: 8, 2: 8, 3: 7}


def test_broadcast_pipelined_chain_from_root():
    dag = schedule("broadcast", 4000, [0, 1, 2, 3], root=2, pipeline_chunks=4)
    # chain 2 -> 3 -> 0 -> 1, chunks of 1000 B; chunk c crosses hop h in phase c + h
    assert dag.bytes_between() == {(2, 3): 4000, (3, 0): 4000, (0, 1): 4000}
    at = index_of(dag)
    assert {(2, 3, c) for c in range(4)} | {(3, 0, c + 1) for c in range(4)} | {(0, 1, c + 2) for c in range(4)} \
        == set(at)
    assert dep_keys(dag, at[(3, 0, 2)]) == {(2, 3, 1), (3, 0, 1)}  # chunk 1 arrived; chunk 0 sent before
    reduce = schedule("reduce", 4000, [0, 1, 2, 3], root=2, pipeline_chunks=4)
    assert reduce.bytes_between() == {(1, 0): 4000, (0, 3): 4000, (3, 2): 4000}  # 1 -> 0 -> 3 -> 2


def test_gather_scatter_send_recv_barrier():
    # gather S = 10 to root 1: pieces (3, 3, 2, 2), rank j sends piece j
    assert schedule("gather", 10, [0, 1, 2, 3], root=1).bytes_between() == {(0, 1): 3, (2, 1): 2, (3, 1): 2}
    assert schedule("scatter", 10, [0, 1, 2, 3], root=1).bytes_between() == {(1, 0): 3, (1, 2): 2, (1, 3): 2}
    sr = schedule("send_recv", 123, [4, 2])
    assert [(t.src, t.dst, t.size_bytes) for t in sr.transfers] == [(4, 2, 123)]
    barrier = schedule("barrier", 0, list(range(5)))
    # dissemination, ceil(log2 5) = 3 rounds: q -> q+1, q+2, q+4 (mod 5), 0 bytes
    assert {t.phase: set() for t in barrier.transfers} == {0: set(), 1: set(), 2: set()}
    assert {(t.src, t.dst) for t in barrier.transfers if t.phase == 2} == {(q, (q + 4) % 5) for q in range(5)}
    assert barrier.total_bytes == 0
    at = index_of(barrier)
    assert dep_keys(barrier, at[(0, 2, 1)]) == {(4, 0, 0)}  # round 1 after the round-0 message arrived


# --- properties of every DAG --------------------------------------------------------------------------

def expected_total(kind: str, size: int, n: int, root_piece: int) -> int:
    """The bytes a collective must move, from its definition."""
    return {"all_reduce": 2 * (n - 1) * size, "reduce_scatter": (n - 1) * size, "all_gather": (n - 1) * size,
            "all_to_all": (n - 1) * size, "broadcast": (n - 1) * size, "reduce": (n - 1) * size,
            "gather": size - root_piece, "scatter": size - root_piece, "send_recv": size, "barrier": 0}[kind]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 6, 8, 16])
@pytest.mark.parametrize("size", [0, 7, 1000, 1 << 20])
def test_every_algorithm_totals_balance_and_phase_order(n, size):
    ranks = [10 + 3 * i for i in range(n)]  # not 0..n-1: the schedule must not assume it
    for kind, algos in ALGORITHMS.items():
        if kind == "send_recv" and n != 2:
            continue
        for algo in algos:
            groups = None
            if algo == "hierarchical":
                if n % 2:
                    continue
                groups = [ranks[: n // 2], ranks[n // 2:]]
            dag = schedule(kind, size, ranks, algo, groups=groups)  # TransferDag checks deps are earlier
            root_piece = split_bytes(size, n)[0]
            assert dag.total_bytes == expected_total(kind, size, n, root_piece), (kind, algo)
            for t in dag.transfers:
                assert all(dag.transfers[d].phase < t.phase for d in t.deps), (kind, algo, t)
            # bytes in == bytes out per rank: trees carry each chunk up and down the same edge, and the
            # doubling steps send back exactly the ranges the halving steps received; rings only when
            # the chunks are equal (uneven chunks: see test_ring_all_reduce_uneven_size_exact)
            if algo in ("tree", "halving_doubling") or (
                    kind in ("all_reduce", "reduce_scatter", "all_gather") and size % n == 0):
                sent, recv = sent_received(dag)
                assert sent == recv, (kind, algo)


# --- errors -------------------------------------------------------------------------------------------

def test_every_workload_kind_has_an_algorithm():
    assert set(ALGORITHMS) == set(KINDS)


def test_unknown_kind_and_algorithm_name_themselves_and_the_known_ones():
    with pytest.raises(TransferError, match=r"unknown collective kind 'allreduce'.*all_reduce"):
        schedule("allreduce", 10, [0, 1])
    with pytest.raises(TransferError, match=r"unknown algorithm 'butterfly' for all_reduce.*ring, tree"):
        schedule("all_reduce", 10, [0, 1], "butterfly")


def test_bad_arguments():
    with pytest.raises(TransferError, match="all_reduce has no root"):
        schedule("all_reduce", 10, [0, 1], root=0)
    with pytest.raises(TransferError, match="root 5 is not one of the ranks"):
        schedule("broadcast", 10, [0, 1], root=5)
    with pytest.raises(TransferError, match="exactly 2 ranks"):
        schedule("send_recv", 10, [0, 1, 2])
    with pytest.raises(TransferError, match="size_bytes must be >= 0, got -1"):
        schedule("all_reduce", -1, [0, 1])
    with pytest.raises(TransferError, match="duplicate ranks"):
        schedule("all_reduce", 10, [0, 1, 1])


# --- placement ----------------------------------------------------------------------------------------

def test_block_placement():
    assert block_placement(8, ["h1", "h2"]).hosts == ("h1",) * 4 + ("h2",) * 4
    assert block_placement(3, ["h1", "h2", "h3", "h4"]).hosts == ("h1", "h2", "h3")
    assert block_placement(6, ["h1", "h2", "h3", "h4"]).hosts == ("h1", "h1", "h2", "h2", "h3", "h3")  # ceil(6/4)=2
    with pytest.raises(TransferError, match="5 ranks do not fill hosts evenly at 2 per host"):
        block_placement(5, ["h1", "h2", "h3", "h4"])
    with pytest.raises(TransferError, match="no hosts"):
        block_placement(2, [])


def test_placement_from_yaml_and_json(tmp_path):
    hosts = ["h1", "h2", "h3"]
    y = tmp_path / "p.yaml"
    y.write_text("0: h2\n1: h2\n2: h1\n3: h3\n")
    assert placement_from_file(y, hosts) == Placement(("h2", "h2", "h1", "h3"))
    j = tmp_path / "p.json"
    j.write_text('{"1": "h1", "0": "h3"}')
    assert placement_from_file(j, hosts).hosts == ("h3", "h1")


@pytest.mark.parametrize("name,text,message", [
    ("missing.yaml", "0: h1\n2: h1\n", r"missing \[1\]"),
    ("dup.yaml", "0: h1\n0: h2\n", "key 0 given twice"),
    ("dup2.yaml", "0: h1\n'0': h2\n", "rank 0 given twice"),
    ("dup.json", '{"0": "h1", "0": "h2"}', "key '0' given twice"),
    ("host.yaml", "0: h9\n", "'h9' is not a host of the fabric"),
    ("rank.yaml", "x: h1\n", "'x' is not a rank"),
    ("list.yaml", "- h1\n", "expected a non-empty mapping"),
    ("broken.json", "{0: ", "not valid JSON"),
])
def test_placement_file_errors(tmp_path, name, text, message):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(TransferError, match=message):
        placement_from_file(p, ["h1", "h2"])


def test_placement_file_unreadable(tmp_path):
    with pytest.raises(TransferError, match="cannot read placement file"):
        placement_from_file(tmp_path / "nope.yaml", ["h1"])


def test_groups_by_leaf():
    placement = block_placement(8, ["h1", "h2", "h3", "h4"])  # 2 ranks per host
    leaf = {"h1": "leaf1", "h2": "leaf1", "h3": "leaf2", "h4": "leaf2"}
    assert groups_by(placement, leaf.__getitem__) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert groups_by(placement, lambda h: h) == ((0, 1), (2, 3), (4, 5), (6, 7))


# --- the array form -----------------------------------------------------------------------------------

def _shuffled(n: int, seed: int) -> list[int]:
    import random
    ranks = list(range(100, 100 + n))
    random.Random(seed).shuffle(ranks)
    return ranks


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_ring_columns_are_the_object_schedule_transfer_for_transfer(kind, n):
    # `schedule` (checked by hand above) is `schedule_columns` as objects: the two forms must be the
    # same DAG (same order, sizes, phases and dependencies), for any rank order and uneven sizes
    from traffic.collectives import schedule_columns
    for size in (0, 1, n + 1, 1_000_003):
        ranks = _shuffled(n, size)
        assert schedule_columns(kind, size, ranks, "ring").same_as(schedule(kind, size, ranks, "ring").columns)


@pytest.mark.parametrize("algo", ["pairwise", "direct"])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13])
def test_all_to_all_columns_are_the_object_schedule(algo, n):
    # built on arrays (1M transfers at 1024 ranks): the same DAG as the objects of `schedule`, checked by hand above
    from traffic.collectives import schedule_columns
    for size in (0, 1, n + 1, 1_000_003):
        ranks = _shuffled(n, size)
        assert schedule_columns("all_to_all", size, ranks, algo).same_as(schedule("all_to_all", size, ranks, algo).columns)


@pytest.mark.parametrize("g, m", [(2, 2), (2, 4), (3, 3), (4, 2), (5, 3), (1, 4), (4, 1)])
def test_hierarchical_columns_are_the_object_schedule(g, m):
    from traffic.collectives import schedule_columns
    ranks = _shuffled(g * m, g * 10 + m)
    groups = [ranks[i::g] for i in range(g)]  # interleaved groups: members far apart in rank order
    for size in (0, 7, 999_983):
        want = schedule("all_reduce", size, ranks, "hierarchical", groups=groups).columns
        assert schedule_columns("all_reduce", size, ranks, "hierarchical", groups=groups).same_as(want)


def test_columns_round_trip_and_the_other_algorithms_convert():
    from traffic.collectives import schedule_columns
    for kind, algo in (("all_reduce", "tree"), ("all_reduce", "halving_doubling"), ("all_to_all", "pairwise")):
        dag = schedule(kind, 4096, list(range(6)), algo)
        cols = schedule_columns(kind, 4096, list(range(6)), algo)
        assert cols.same_as(dag.columns)
        assert cols.to_dag() == dag
        assert cols.total_bytes == dag.total_bytes and cols.phases() == dag.phases()


def test_columns_are_checked_like_the_dag():
    import numpy as np

    from fabric.transfers import TransferColumns
    good = schedule("all_reduce", 1000, [0, 1, 2], "ring").columns

    def with_(**change):
        fields = {f: getattr(good, f) for f in ("src", "dst", "size_bytes", "phase", "dep_ptr", "dep")}
        fields.update(change)
        return TransferColumns(**fields, ranks=good.ranks, label="t")

    with pytest.raises(TransferError, match="rank not in"):
        with_(src=np.where(np.arange(len(good)) == 2, 7, good.src))
    with pytest.raises(TransferError, match="two different ranks"):
        with_(dst=good.src.copy())
    with pytest.raises(TransferError, match="size_bytes must be >= 0"):
        with_(size_bytes=good.size_bytes - 10_000)
    with pytest.raises(TransferError, match="is not an earlier transfer"):
        with_(dep=good.dep[::-1].copy())
    with pytest.raises(TransferError, match="different lengths"):
        with_(phase=good.phase[:-1])


# --- PAT ----------------------------------------------------------------------------------------------------

def test_pat_all_gather_5_ranks_by_hand():
    # n = 5, S = 5000: blocks of 1000. Step 0 (d = 1): q sends block q to q - 1; step 1 (d = 2): blocks q, q+1 to
    # q - 2; step 2 (d = 4, c = min(4, 1) = 1): block q to q - 4 = q + 1. Each rank sends 4000 = (n-1)/n x S.
    dag = schedule("all_gather", 5000, list(range(5)), "pat")
    assert by_phase(dag) == {0: {(q, (q - 1) % 5): 1000 for q in range(5)},
                             1: {(q, (q - 2) % 5): 2000 for q in range(5)},
                             2: {(q, (q + 1) % 5): 1000 for q in range(5)}}
    at = index_of(dag)
    # rank 3's step-2 send waits for both of its earlier receives (from 4 at step 0, from 0 at step 1)
    assert dep_keys(dag, at[(3, 4, 2)]) == {(4, 3, 0), (0, 3, 1)}


def test_pat_reduce_scatter_is_the_all_gather_reversed():
    ag = by_phase(schedule("all_gather", 8000, list(range(4)), "pat"))
    rs = by_phase(schedule("reduce_scatter", 8000, list(range(4)), "pat"))
    # n = 4: all-gather d = 1 (2000 B to q - 1), then d = 2 (4000 B to q - 2); reduce-scatter: d = 2 first, then 1,
    # each towards q + d
    assert ag == {0: {(q, (q - 1) % 4): 2000 for q in range(4)}, 1: {(q, (q - 2) % 4): 4000 for q in range(4)}}
    assert rs == {0: {((q - 2) % 4, q): 4000 for q in range(4)}, 1: {((q - 1) % 4, q): 2000 for q in range(4)}}


def test_pat_refuses_a_group_with_two_gpus_in_a_server():
    with pytest.raises(TransferError, match="PAT only with one GPU per server"):
        schedule("all_gather", 4000, [0, 1, 4], "pat", servers=[(0, 1, 2, 3), (4, 5, 6, 7)])
    assert len(schedule("all_gather", 4000, [0, 4], "pat", servers=[(0, 1, 2, 3), (4, 5, 6, 7)])) == 2
