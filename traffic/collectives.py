"""Collectives as transfer DAGs: which rank sends how many bytes to which, in which step, after what.

`schedule(kind, size_bytes, ranks, algorithm)` turns one collective into a `fabric.transfers.TransferDag`
that both backends execute. Sizes follow the nccl-tests convention of `traffic.workload` (all-reduce,
broadcast, reduce: the buffer; all-gather, gather: the whole output; reduce-scatter, scatter: the whole
input; all-to-all: one rank's whole send buffer; send_recv: the message).

Conventions shared by every algorithm:
- Bytes are exact: a buffer of S bytes cut into k pieces gives pieces that differ by at most one byte
  and sum to S (`split_bytes`: the first S mod k pieces carry the extra byte). Pieces of 0 bytes are
  kept as 0-byte transfers, so a DAG's shape never depends on S (but for S = 0: "Empty collectives").
- Dependencies say when data is there: a transfer waits for the transfers that delivered the data it
  forwards or reduces (ring: rank r's send at step k waits for its receive at step k-1). On top, the
  transfers over one connection (src, dst) are ordered: each waits for the previous one on that
  connection, as a connection delivers in order (the two trees of `tree` are two channels, as in
  NCCL, each with its own connections). Data already on a rank at the start needs nothing.
- `phase` is the step of the algorithm in an ideal lock-step run (0, 1, ...). Pipelined algorithms
  (broadcast, reduce) overlap: chunk c crosses its h-th hop in phase c + h.
- The rings of one NIC each (`nic_rings`) leave out the order per connection: NCCL keeps several steps of a
  connection in flight (NCCL_STEPS), so a ring's latency is its data path's, not its steps' (a connection's
  steps may then share its NIC for a while, where NCCL would send them in order: up to 3% later measured).
- Transfers between two ranks on the same host stay in the DAG; the backend decides they are local.
- The ring order is the order of `ranks` as given; the caller picks it (e.g. sorted by placement).

Algorithms (`ALGORITHMS`):
- all_reduce `ring`: reduce-scatter then all-gather around the ring, 2(n-1) steps of S/n per rank.
- all_reduce `tree`: NCCL's double binary tree between servers with a chain inside each, as steady-state flows
  (issue 43 part 3), not as thousands of chunk transfers. The trees' shape: tree A is an in-order binary tree
  over positions 0..n-1 of the nodes: position 0 is the root with one child; positions 1..n-1 form a tree
  where the root of any range of positions is the one with the most trailing zero bits (so odd positions are
  the leaves; n=8: 0 -> 4, 4 -> 2 and 6, 2 -> 1 and 3, 6 -> 5 and 7), as NCCL's `ncclGetBtree`
  (src/graph/trees.cc). Tree B is the same shape over a renumbering: mirrored (position p holds node n-1-p)
  when n is even, shifted (node (p+1) % n) when n is odd, so that the leaves of one tree are inner nodes of
  the other (`ncclGetDtree`). The nodes are the group's servers where it has the same k > 1 GPUs on each
  (`server_blocks`), else its ranks (k = 1). Per NIC j (the j-th GPU of each server, NCCL's trees enter and
  leave a node through one NIC: src/graph/search.cc:601) and tree t, part 2j + t of the buffer (S/(2k)) moves
  as flows that all run at once: up every tree edge (child's GPU j -> parent's GPU j) and down it, and up and
  down each server's chain over NVLink (GPU j, j+1, ..., j-1: the tail's data climbs to GPU j). The down
  flows wait for the fill: a 0-byte token climbs from every chain's tail to the root, each node's after its
  children's; a 0-byte token then descends behind the down flows (the drain). So the time is fill + the flows
  at their common max-min rate + drain: the latency of NCCL's model, 2 x ((k-1) intra + depth x inter)
  (src/graph/tuning.cc:416), and a server inner in one tree and a leaf in the other sends 4 parts (2S/k) out
  of each NIC: busbw S/T x 2(n-1)/n -> k x the NIC rate at large n.
- all_reduce `halving_doubling`: recursive halving reduce-scatter (partner at distance p/2 first,
  then p/4, ... 1, sending S/2, S/4, ... S/p), then recursive doubling all-gather (distance 1, 2, ...
  p/2, sending S/p, ... S/2). For n not a power of two, with p the largest power of two below n and
  r = n - p: Rabenseifner's extra steps. First a pre-step (phase 0): ranks[2i] sends its whole buffer
  to ranks[2i+1] for i < r; the p ranks ranks[1], ranks[3], ..., ranks[2r-1], ranks[2r:] then run the
  power-of-two algorithm; last a post-step: ranks[2i+1] sends the whole result back to ranks[2i].
- all_reduce `hierarchical`: with `groups` of equal size m (e.g. the ranks under one leaf switch):
  ring reduce-scatter inside each group (member j ends with chunk j of S/m), ring all-reduce of
  chunk j across the groups between the j-th members, ring all-gather inside each group.
- all_gather, reduce_scatter `ring`: n-1 steps of S/n per rank; position q ends with / starts with
  chunk q.
- all_gather, reduce_scatter `pat`: NCCL's PAT, at one GPU per server only (src/graph/tuning.cc:220), as a flow
  model with its logarithmic steps: Bruck's all-gather (`pat_steps`), ceil(log2 n) steps, in step i position q
  sends the 2^i blocks it holds (fewer in the last) to q - 2^i; (n-1)/n x S a rank in all, as the ring.
  Reduce-scatter: the same transfers reversed in direction and order. NCCL's PAT aggregates and bounds its
  buffers (src/include/collectives.h, PatAGAlgorithm/PatRSAlgorithm); its bandwidth cost (x0.75 in NCCL's
  model, tuning.cc:337) is the tuning model's, not this DAG's.
- all_to_all `pairwise` (the default): n-1 rounds; in round k position q sends piece q+k to q+k and
  receives from q-k, after its receive of round k-1 has arrived: each round is a permutation, so no
  receiver takes more than one sender at a time (NCCL schedules its grouped sends and receives to
  peers in this order of distance, a few at a time). Without it, n-1 senders converge on every
  receiver at once (incast), which on slow emulated links costs TCP timeouts rather than bandwidth.
- all_to_all `direct`: every rank sends piece j of its buffer (S/n) to rank j, all at once (no
  dependencies, as NCCL posts them as one group); phase k-1 labels the shift k (q sends to q+k).
- broadcast `ring`: a pipelined chain from the root along the ring (root, root+1, ...) in
  `pipeline_chunks` chunks; reduce `ring`: the reverse chain, ending at the root.
- gather, scatter `direct`: every other rank sends its piece (S/n) to the root / receives it from it.
- send_recv `direct`: one transfer ranks[0] -> ranks[1].
- barrier `dissemination`: ceil(log2 n) rounds of 0-byte messages, q -> q + 2^k in round k, each
  after the message received in the round before.

Empty collectives (`discarded`): a collective of 0 bytes of any kind but send_recv and barrier is an
empty DAG (no transfer: it takes no time and moves nothing), as NCCL discards it before it is ever
enqueued: NVIDIA/nccl src/enqueue.cc:3023-3024, `taskAppend`, "// Empty collectives can be discarded.
if (info->count == 0) return ncclSuccess;" (NCCL 2.30.7, `makefiles/version.mk`; commit 5067397c, read
2026-12). That check sits in the branch of the collectives only (all-to-all, gather and scatter included,
which NCCL builds from p2p tasks after it); a send or receive goes to `p2pTaskAppend`, which queues a task
whatever its count, and `addP2pToPlan` gives a 0-byte one a proxy step of 0 bytes ("else if (bytes == 0)
{ proxyOps[dir].nsteps = 1; proxyOps[dir].nbytes = 0; }"): a 0-byte send_recv is one 0-byte transfer and
keeps its latency. A barrier is not an NCCL call (PyTorch's is an all-reduce of one element): its 0-byte
messages are the synchronisation it stands for, and it is kept.

Construction: every algorithm is written once, against one builder that holds the DAG as arrays
(`traffic.dag_builder.DagBuilder`). The ring steps (all_reduce `ring` and `hierarchical`,
reduce_scatter and all_gather `ring`) and the all-to-all rounds (~n^2 transfers: 1M at 1024 ranks)
go in as whole blocks of arrays, the other algorithms transfer by transfer. `schedule_columns`
returns the `TransferColumns` (the simulator's input at thousands of ranks, where objects do not
fit); `schedule` the same DAG as `Transfer` objects (`TransferColumns.to_dag`).

Placement (rank -> host, and the groups for `hierarchical`) is `traffic.placement`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fabric.transfers import TransferColumns, TransferDag, TransferError, split_bytes
from traffic.dag_builder import DagBuilder
from traffic.workload import KINDS

#: The algorithms per collective kind; the first is what "auto" picks (see `resolve_algorithm`).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "halving_doubling", "hierarchical"),
    "reduce_scatter": ("ring", "pat"),
    "all_gather": ("ring", "pat"),
    "all_to_all": ("pairwise", "direct"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "gather": ("direct",),
    "scatter": ("direct",),
    "send_recv": ("direct",),
    "barrier": ("dissemination",),
}

#: Kinds whose ring runs one ring per NIC where the group has several GPUs in each server (`nic_rings`).
NIC_RING_KINDS = ("all_reduce", "reduce_scatter", "all_gather")

#: Chunks per pipelined stream (the broadcast/reduce chain).
DEFAULT_PIPELINE_CHUNKS = 4

_ROOTED = ("broadcast", "reduce", "gather", "scatter")

#: Kinds that run when they carry 0 bytes (module docstring, "Empty collectives"): NCCL still hands a 0-byte
#: send/recv to its proxy; a barrier's messages are 0-byte by definition.
KEPT_WHEN_EMPTY = ("send_recv", "barrier")
#: Where NCCL discards an empty collective, for the notes of a run that had some.
NCCL_DISCARDS_EMPTY = "NCCL 2.30.7 src/enqueue.cc, taskAppend: if (info->count == 0) return ncclSuccess"

Ready = dict[int, tuple[int, ...]]  # rank -> the transfers whose delivery its data waits for


# --- rings ------------------------------------------------------------------------------------------

def _ring_steps(dag: DagBuilder, ring: Sequence[int], chunk_bytes: Sequence[int], phase0: int, ready: Ready,
                shift: int) -> Ready:
    """n - 1 ring steps, one block of arrays (channel 0): in step k position q sends chunk
    (q - k - shift) mod n to q + 1, after its previous receive (step 0: after `ready`). Returns rank ->
    its last receive."""
    n = len(ring)
    steps = n - 1
    if steps < 1:
        return {r: ready.get(r, ()) for r in ring}
    base = dag.n
    members = np.asarray(ring, dtype=np.int64)
    nxt = np.roll(members, -1)
    k = np.repeat(np.arange(steps, dtype=np.int64), n)
    q = np.tile(np.arange(n, dtype=np.int64), steps)
    size = np.asarray(chunk_bytes, dtype=np.int64)[(q - k - shift) % n]
    # dependencies: the receive before (from q - 1, a step earlier) and the send before on the
    # same connection; at step 0, `ready` and the connection's last send before this block
    first = [tuple(ready.get(r, ())) + dag.previous_on(r, d) for r, d in zip(ring, nxt.tolist())]
    width = max(2, max(len(f) for f in first))
    deps = np.full((steps * n, width), -1, dtype=np.int64)
    for pos, f in enumerate(first):
        deps[pos, :len(f)] = f
    later = np.arange(n, steps * n)
    deps[later, 0] = base + later - n - q[later] + (q[later] - 1) % n
    deps[later, 1] = base + later - n
    deps[later, 2:] = -1
    dag.block(np.tile(members, steps), np.tile(nxt, steps), size, phase0 + k, deps)
    last = base + (steps - 1) * n
    for pos, (r, d) in enumerate(zip(ring, nxt.tolist())):
        dag.record_on(r, d, last + pos)
    return {int(nxt[pos]): (last + pos,) for pos in range(n)}


def _ring_reduce_scatter(dag: DagBuilder, ring: Sequence[int], chunks: Sequence[int], phase0: int,
                         ready: Ready) -> Ready:
    """Ring reduce-scatter; position q ends holding the reduced chunk q. Step k: q sends chunk
    (q - k - 1) mod n to q + 1. Returns rank -> its last receive (the reduced chunk is complete then)."""
    return _ring_steps(dag, ring, chunks, phase0, ready, shift=1)


def _ring_all_gather(dag: DagBuilder, ring: Sequence[int], chunks: Sequence[int], phase0: int,
                     ready: Ready) -> Ready:
    """Ring all-gather; position q starts with chunk q. Step k: q sends chunk (q - k) mod n to q + 1,
    the chunk it received in step k-1. Returns rank -> its own readiness plus its last receive (the
    earlier receives come over the same connection, so the last one implies them)."""
    if len(ring) == 1:
        return {r: ready.get(r, ()) for r in ring}
    waits = _ring_steps(dag, ring, chunks, phase0, ready, shift=0)
    return {r: tuple(sorted(set(ready.get(r, ())) | set(waits[r]))) for r in ring}


def _ring_all_reduce(dag: DagBuilder, ring: Sequence[int], size_bytes: int, phase0: int, ready: Ready) -> Ready:
    chunks = split_bytes(size_bytes, len(ring))
    reduced = _ring_reduce_scatter(dag, ring, chunks, phase0, ready)
    return _ring_all_gather(dag, ring, chunks, phase0 + len(ring) - 1, reduced)


def server_blocks(ranks: Sequence[int], servers: Sequence[Sequence[int]] | None) -> list[list[int]] | None:
    """The group's ranks by server, servers in the order of the group's first rank on each (never re-sorted),
    ranks in group order, where the group has the same k > 1 ranks on each of N > 1 servers; else None (one
    GPU per server, one server, or an uneven group: one ring over the group as given)."""
    if not servers:
        return None
    server_of = {r: i for i, members in enumerate(servers) for r in members}
    if any(r not in server_of for r in ranks):
        return None
    blocks: dict[int, list[int]] = {}
    for r in ranks:
        blocks.setdefault(server_of[r], []).append(r)
    out = list(blocks.values())
    k = len(out[0])
    if len(out) < 2 or k < 2 or any(len(b) != k for b in out):
        return None
    return out


def nic_rings(blocks: Sequence[Sequence[int]]) -> list[list[int]]:
    """NCCL's rings on servers of k GPUs of the group, one per NIC (src/graph/search.cc: a ring enters a node at
    NET n, chains its GPUs over NVLink and leaves through NET n, crossNic 0 tried first): ring j enters each server
    at its j-th GPU and chains the others in order (j, j+1, ..., j-1); the server's exit leaves through the j-th
    GPU's NIC (`_nic_ring_pass`)."""
    k = len(blocks[0])
    return [[b[(j + i) % k] for b in blocks for i in range(k)] for j in range(k)]


def _nic_ring_pass(dag: DagBuilder, ring: Sequence[int], k: int, chunks: Sequence[int], phase0: int, ready: Ready,
                   shift: int, channel: int, pxn: bool = True) -> Ready:
    """n - 1 steps of a per-NIC ring (`nic_rings`, k GPUs a server), one block of arrays: in step s position q
    sends chunk (q - s - shift) mod n to q + 1 after its previous receive (step 0: after `ready`), as `_ring_steps`;
    a server's last GPU x sends to the next server through its entry GPU a's NIC, as PXN does: x -> a over
    NVLink, then a -> the next server's entry GPU over the fabric. Each transfer also waits for the one before
    on its connection. Returns rank -> its last receive."""
    n = len(ring)
    if n < 2:
        return {r: ready.get(r, ()) for r in ring}
    steps = n - 1
    members = np.asarray(ring, dtype=np.int64)
    q = np.arange(n, dtype=np.int64)
    exit_ = (q % k == k - 1) & pxn  # without PXN the last GPU sends through its own NIC (another rail)
    first = q + np.concatenate([[0], np.cumsum(exit_)[:-1]])  # a position's first slot in a step
    final = first + exit_  # the slot that delivers to q + 1
    m = n + int(exit_.sum())  # slots a step
    slot_pos = np.repeat(q, 1 + exit_)  # the position each slot belongs to
    is_net = np.zeros(m, dtype=bool)
    is_net[final[exit_]] = True
    is_relay = np.zeros(m, dtype=bool)
    is_relay[first[exit_]] = True
    entry = members[q - (k - 1)]  # for exits: the server's entry GPU, whose NIC sends
    src = np.where(is_net, entry[slot_pos], members[slot_pos])
    dst = np.where(is_relay, entry[slot_pos], members[(slot_pos + 1) % n])
    base = dag.n
    step = np.repeat(np.arange(steps, dtype=np.int64), m)
    slot = np.tile(np.arange(m, dtype=np.int64), steps)
    pos = slot_pos[slot]
    size = np.asarray(chunks, dtype=np.int64)[(pos - step - shift) % n]
    deps = np.full((steps * m, 3), -1, dtype=np.int64)
    for i in range(m):  # step 0: `ready` (not for a network hop: it waits for its NVLink hop) and the connection
        before = () if is_net[i] else tuple(ready.get(int(members[slot_pos[i]]), ()))
        got = before + dag.previous_on(int(src[i]), int(dst[i]), channel) + ((base + i - 1,) if is_net[i] else ())
        if len(got) > 3:
            raise TransferError(f"ring pass: {len(got)} dependencies for one transfer")
        deps[i, :len(got)] = got
    later = np.arange(m, steps * m)
    prev_step = base + (step[later] - 1) * m
    # its sender's receive a step before (the previous position's delivering slot), or, for a network hop, the
    # NVLink hop just before it; not the same slot a step before: NCCL keeps several steps of a connection in
    # flight (NCCL_STEPS), so a step's latency is not paid again by the next on the connection, and the ring's
    # latency is its data path's: 2(n-1) steps, of which those leaving a server pay the network's (tuning.cc:412)
    recv = prev_step + final[(pos[later] - 1) % n]
    deps[later, 0] = np.where(is_net[slot[later]], base + later - 1, recv)
    deps[later, 1:] = -1
    dag.block(np.tile(src, steps), np.tile(dst, steps), size, phase0 + step, deps)
    last = base + (steps - 1) * m
    for i in range(m):
        dag.record_on(int(src[i]), int(dst[i]), last + i, channel)
    return {int(members[(p + 1) % n]): (last + int(final[p]),) for p in range(n)}


def _nic_ring_collective(dag: DagBuilder, kind: str, blocks: Sequence[Sequence[int]], size_bytes: int,
                         pxn: bool = True) -> None:
    """`kind` (all_reduce, reduce_scatter, all_gather) as k per-NIC rings (`nic_rings`), ring j carrying part j of
    the buffer (`split_bytes(size_bytes, k)`) on its own channel: a reduce-scatter pass (shift 1), an all-gather
    pass (shift 0), or the one then the other."""
    k = len(blocks[0])
    for j, (ring, part) in enumerate(zip(nic_rings(blocks), split_bytes(size_bytes, k))):
        chunks = split_bytes(part, len(ring))
        ready: Ready = {}
        if kind in ("all_reduce", "reduce_scatter"):
            ready = _nic_ring_pass(dag, ring, k, chunks, 0, ready, 1, j, pxn)
        if kind in ("all_reduce", "all_gather"):
            _nic_ring_pass(dag, ring, k, chunks, len(ring) - 1 if kind == "all_reduce" else 0, ready, 0, j, pxn)


# --- double binary tree -------------------------------------------------------------------------------

def _range_root(lo: int, hi: int) -> int:
    """The position in [lo, hi) (lo >= 1) with the most trailing zero bits (unique: of two multiples
    of b in a range, one is a multiple of 2b)."""
    b = 1 << ((hi - 1).bit_length() - 1)
    while b >= 1:
        m = -(-lo // b) * b
        if m < hi:
            return m
        b >>= 1
    raise TransferError(f"empty position range [{lo}, {hi})")  # unreachable for lo < hi


def tree_children(n: int) -> tuple[tuple[int, ...], ...]:
    """Tree A of the double binary tree over positions 0..n-1: position -> its children (see the module
    docstring). Position 0 is the root."""
    children: list[list[int]] = [[] for _ in range(n)]

    def build(lo: int, hi: int) -> int:
        top = _range_root(lo, hi)
        if lo < top:
            children[top].append(build(lo, top))
        if top + 1 < hi:
            children[top].append(build(top + 1, hi))
        return top

    if n > 1:
        children[0].append(build(1, n))
    return tuple(tuple(c) for c in children)


def double_binary_trees(ranks: Sequence[int]) -> tuple[dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
    """The two trees as rank -> its children (root first in iteration order): tree A over positions as
    given, tree B over the mirrored (even n) or shifted (odd n) numbering."""
    n = len(ranks)
    shape = tree_children(n)
    mirror = [ranks[n - 1 - p] for p in range(n)] if n % 2 == 0 else [ranks[(p + 1) % n] for p in range(n)]
    out = []
    for at in (list(ranks), mirror):
        out.append({at[p]: tuple(at[c] for c in shape[p]) for p in _preorder(shape)})
    return out[0], out[1]


def _preorder(shape: tuple[tuple[int, ...], ...]) -> list[int]:
    order: list[int] = []
    stack = [0] if shape else []
    while stack:
        p = stack.pop()
        order.append(p)
        stack.extend(reversed(shape[p]))
    return order


def _tree_all_reduce(dag: DagBuilder, ranks: Sequence[int], size_bytes: int,
                     blocks: Sequence[Sequence[int]] | None) -> None:
    """NCCL's tree all-reduce as steady-state flows (module docstring, all_reduce `tree`): per NIC j and tree t,
    part 2j + t of the buffer; bulk flows up and down every edge, 0-byte tokens for the fill and the drain."""
    nodes = [list(b) for b in blocks] if blocks is not None else [[r] for r in ranks]
    k = len(nodes[0])
    parts = split_bytes(size_bytes, 2 * k)
    for j in range(k):
        chains = [[b[(j + i) % k] for i in range(k)] for b in nodes]  # enter at the GPU of NIC j, then NVLink
        for t, tree in enumerate(double_binary_trees(list(range(len(nodes))))):
            _tree_flows(dag, chains, tree, parts[2 * j + t], 2 * (j * 2 + t))


def _tree_flows(dag: DagBuilder, chains: Sequence[Sequence[int]], tree: dict[int, tuple[int, ...]], part: int,
                channel: int) -> None:
    """One tree of one NIC over the nodes' chains (head = chain[0], on the tree's NIC): `part` bytes up and down
    each edge and each NVLink hop of a chain, all at once (bulk, on `channel`); a 0-byte token climbs from every
    chain's tail to the root after its children's tokens (the fill) before the down flows start, and descends
    behind the down flows (the drain), on `channel + 1`. Phases: up flows 0, up tokens 1.., down flows after
    them, down tokens after those (every dependency has a lower phase)."""
    k = len(chains[0])
    order = list(tree)  # pre-order: parents before children
    if len(order) < 2 and k < 2:
        return
    parent = {c: p for p, cs in tree.items() for c in cs}
    height: dict[int, int] = {}
    for v in reversed(order):
        height[v] = 1 + max((height[c] for c in tree[v]), default=-1)
    tok = channel + 1
    for v in order:  # up flows: the chain's tail towards its head, the head to the parent's head
        ch = chains[v]
        for i in range(k - 1, 0, -1):
            dag.send(ch[i], ch[i - 1], part, 0, (), channel)
        if v in parent:
            dag.send(ch[0], chains[parent[v]][0], part, 0, (), channel)
    arrived: dict[int, list[int]] = {v: [] for v in order}  # node -> the tokens its children sent up
    fill: tuple[int, ...] = ()
    for v in reversed(order):  # children before parents
        ch, phase = chains[v], 1 + height[v] * k
        prev: tuple[int, ...] = ()
        for i in range(k - 1, 0, -1):
            prev = (dag.send(ch[i], ch[i - 1], 0, phase, prev, tok),)
            phase += 1
        after = prev + tuple(arrived[v])
        if v in parent:
            arrived[parent[v]].append(dag.send(ch[0], chains[parent[v]][0], 0, phase, after, tok))
        else:
            fill = after
    down_phase = 1 + (height[order[0]] + 1) * k
    flow: dict[tuple[int, int], int] = {}  # (sender, receiver) -> its down flow
    for v in order:
        ch = chains[v]
        for i in range(k - 1):
            flow[(ch[i], ch[i + 1])] = dag.send(ch[i], ch[i + 1], part, down_phase, fill, channel)
        for c in tree[v]:
            flow[(ch[0], chains[c][0])] = dag.send(ch[0], chains[c][0], part, down_phase, fill, channel)
    came: dict[int, tuple[int, ...]] = {order[0]: fill}  # node -> the token that reached its head
    depth = {order[0]: 0}
    for v in order:
        ch, phase = chains[v], down_phase + 1 + depth[v] * k
        prev = came[v]
        for i in range(k - 1):
            prev = (dag.send(ch[i], ch[i + 1], 0, phase + i, prev + (flow[(ch[i], ch[i + 1])],), tok),)
        for c in tree[v]:
            head = chains[c][0]
            came[c] = (dag.send(ch[0], head, 0, phase + k - 1, came[v] + (flow[(ch[0], head)],), tok),)
            depth[c] = depth[v] + 1


# --- halving-doubling ---------------------------------------------------------------------------------

def _halving_doubling_core(dag: DagBuilder, active: Sequence[int], size_bytes: int, phase0: int,
                           ready: Ready) -> Ready:
    """Power-of-two recursive halving reduce-scatter + recursive doubling all-gather over `active`.
    A rank's buffer accumulates: what it sends in a step was touched by every receive before, so each
    send waits for all of the rank's earlier receives (log2 p of them at most). Returns rank -> the
    transfers after which it holds the whole result."""
    p = len(active)
    chunks = split_bytes(size_bytes, p)
    steps = p.bit_length() - 1
    got: dict[int, list[int]] = {r: list(ready.get(r, ())) for r in active}
    for k in range(2 * steps):
        if k < steps:  # halving: distance p/2, p/4, ..., 1; send the half of the range without q
            d = p >> (k + 1)
        else:  # doubling: distance 1, 2, ..., p/2; send the whole range gathered so far
            d = 1 << (k - steps)
        received: dict[int, int] = {}
        for q, r in enumerate(active):
            if k < steps:
                lo = (q & ~(2 * d - 1)) + (0 if q & d else d)
            else:
                lo = q & ~(d - 1)
            partner = active[q ^ d]
            received[partner] = dag.send(r, partner, sum(chunks[lo:lo + d]), phase0 + k, got[r])
        for r, idx in received.items():
            got[r].append(idx)
    return {r: tuple(got[r]) for r in active}


def _halving_doubling(dag: DagBuilder, ranks: Sequence[int], size_bytes: int) -> None:
    n = len(ranks)
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    ready: Ready = {}
    for i in range(extra):  # pre-step: fold ranks[2i] into ranks[2i+1]
        ready[ranks[2 * i + 1]] = (dag.send(ranks[2 * i], ranks[2 * i + 1], size_bytes, 0),)
    active = [ranks[2 * i + 1] for i in range(extra)] + list(ranks[2 * extra:])
    base = 1 if extra else 0
    done = _halving_doubling_core(dag, active, size_bytes, base, ready)
    last = base + 2 * (p.bit_length() - 1)
    for i in range(extra):  # post-step: hand the result back
        dag.send(ranks[2 * i + 1], ranks[2 * i], size_bytes, last, done[ranks[2 * i + 1]])


# --- PAT (all-gather, reduce-scatter at one GPU per server) -----------------------------------------------

def pat_steps(n: int) -> list[list[tuple[int, int, tuple[int, ...]]]]:
    """PAT's all-gather as a flow model (module docstring, `pat`): per step i (distance d = 2^i, ceil(log2 n) steps)
    each position q's (sender, receiver, blocks): q sends q - d (mod n) the blocks q, q+1, ..., q+c-1 (mod n) it
    holds, c = min(d, n - d), so that after step i it holds 2^(i+1) blocks (or all n)."""
    steps = []
    d = 1
    while d < n:
        c = min(d, n - d)
        steps.append([(q, (q - d) % n, tuple((q + b) % n for b in range(c))) for q in range(n)])
        d *= 2
    return steps


def _pat(dag: DagBuilder, kind: str, ranks: Sequence[int], size_bytes: int) -> None:
    """PAT all_gather (`pat_steps`) or reduce_scatter (the same transfers reversed in direction and order: partial
    sums of the blocks travel towards their owners); each send waits for all of its sender's earlier receives."""
    n = len(ranks)
    blocks = split_bytes(size_bytes, n)
    steps = pat_steps(n)
    if kind == "reduce_scatter":
        steps = [[(dst, src, bs) for src, dst, bs in step] for step in reversed(steps)]
    got: dict[int, list[int]] = {q: [] for q in range(n)}
    for phase, step in enumerate(steps):
        received = [(dst, dag.send(ranks[src], ranks[dst], sum(blocks[b] for b in bs), phase, got[src]))
                    for src, dst, bs in step]
        for dst, index in received:
            got[dst].append(index)


# --- hierarchical -------------------------------------------------------------------------------------

def _hierarchical(dag: DagBuilder, groups: Sequence[Sequence[int]] | None, size_bytes: int) -> None:
    if groups is None:
        raise TransferError("hierarchical all_reduce needs groups (e.g. groups_by(placement, leaf))")
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise TransferError(f"hierarchical all_reduce needs groups of equal size, got sizes "
                            f"{[len(g) for g in groups]}")
    m = sizes.pop()
    g = len(groups)
    chunks = split_bytes(size_bytes, m)
    ready: Ready = {}
    for group in groups:
        ready.update(_ring_reduce_scatter(dag, group, chunks, 0, {}))
    inter0 = m - 1
    for j in range(m):
        column = [group[j] for group in groups]
        ready.update(_ring_all_reduce(dag, column, chunks[j], inter0, ready))
    intra0 = inter0 + 2 * (g - 1)
    for group in groups:
        _ring_all_gather(dag, group, chunks, intra0, ready)


# --- one-shot and pipelined-chain collectives --------------------------------------------------------

def _chain(dag: DagBuilder, chain: Sequence[int], size_bytes: int, pipeline_chunks: int) -> None:
    """Pipelined chain chain[0] -> chain[1] -> ...: chunk c crosses hop h in phase c + h, after it
    arrived at chain[h]."""
    for c, chunk in enumerate(split_bytes(size_bytes, pipeline_chunks)):
        arrived: tuple[int, ...] = ()
        for h in range(len(chain) - 1):
            arrived = (dag.send(chain[h], chain[h + 1], chunk, c + h, arrived),)


def _all_to_all(dag: DagBuilder, ranks: Sequence[int], size_bytes: int, pairwise: bool) -> None:
    """Round k (1..n-1, phase k-1) is the block of transfers (k-1)n + q: position q sends piece q+k of
    its buffer to position q+k (piece j goes to position j); pairwise, after its receive of round k-1
    (from position q-k+1). Each connection carries one transfer."""
    n = len(ranks)
    if n < 2:
        return
    members = np.asarray(ranks, dtype=np.int64)
    pieces = np.asarray(split_bytes(size_bytes, n), dtype=np.int64)
    k = np.repeat(np.arange(1, n, dtype=np.int64), n)
    q = np.tile(np.arange(n, dtype=np.int64), n - 1)
    to = (q + k) % n
    deps = np.full((k.size, 1), -1, dtype=np.int64)
    if pairwise:
        later = k >= 2
        deps[later, 0] = dag.n + (k[later] - 2) * n + (q[later] - k[later] + 1) % n
    dag.block(members[q], members[to], pieces[to], k - 1, deps)


#: Network rounds of a grouped all-to-all a rank has in flight at once (`_grouped_all_to_all`).
A2A_ROUNDS_IN_FLIGHT = 3


def _grouped_all_to_all(dag: DagBuilder, blocks: Sequence[Sequence[int]], size_bytes: int, pxn: bool = True) -> None:
    """An all-to-all over k GPUs in each of N servers as NCCL posts it, one group of sends and receives
    (src/enqueue.cc, p2p tasks): the NVLink peers and the network peers at the same time, as two chains of rounds.
    Network round (d, l), d = 1..N-1, l = 0..k-1: GPU i of server s sends its piece for GPU (i + l) mod k of server
    s + d, a permutation, so each NIC sends one flow and receives one a round; a rank's round waits for its receive
    A2A_ROUNDS_IN_FLIGHT rounds before (NCCL keeps several peers in flight). With PXN (`pxn`, NCCL's default:
    src/graph/search.cc:1427-1471 sends to a remote GPU through the local GPU of the peer's index) a piece for
    another rail first crosses NVLink to that local GPU, whose NIC sends it: every network byte stays on its rail.
    NVLink rounds l = 1..k-1: GPU i to GPU i + l of its own server, each after its previous NVLink receive."""
    k, n_servers = len(blocks[0]), len(blocks)
    ranks = [r for b in blocks for r in b]
    pieces = split_bytes(size_bytes, len(ranks))
    piece = {r: pieces[p] for p, r in enumerate(ranks)}  # the piece for rank r (every sender's piece r)
    net_recv: dict[int, list[int]] = {r: [] for r in ranks}  # each rank's network receives, in round order
    phase = 0
    for d in range(1, n_servers):
        for l in range(k):
            got: dict[int, int] = {}
            for s, b in enumerate(blocks):
                for i, src in enumerate(b):
                    dst = blocks[(s + d) % n_servers][(i + l) % k]
                    mine = net_recv[src]
                    after = (mine[-A2A_ROUNDS_IN_FLIGHT],) if len(mine) >= A2A_ROUNDS_IN_FLIGHT else ()
                    via = b[(i + l) % k]
                    if pxn and via != src:  # PXN: over NVLink to the GPU of the peer's rail, out through its NIC
                        hop = dag.send(src, via, piece[dst], phase, after)
                        got[dst] = dag.send(via, dst, piece[dst], phase, (hop,))
                    else:
                        got[dst] = dag.send(src, dst, piece[dst], phase, after)
            for dst, t in got.items():
                net_recv[dst].append(t)
            phase += 1
    for l in range(1, k):
        for b in blocks:
            for i, src in enumerate(b):
                dag.send(src, b[(i + l) % k], piece[b[(i + l) % k]], l - 1)


def _dissemination_barrier(dag: DagBuilder, ranks: Sequence[int]) -> None:
    n = len(ranks)
    waits: Ready = {r: () for r in ranks}
    k = 0
    while (1 << k) < n:
        received: Ready = {}
        for q, r in enumerate(ranks):
            dst = ranks[(q + (1 << k)) % n]
            received[dst] = (dag.send(r, dst, 0, k, waits[r]),)
        waits = received
        k += 1


# --- entry point ----------------------------------------------------------------------------------------

def discarded(kind: str, size_bytes: int) -> bool:
    """Whether a collective of `kind` and `size_bytes` is discarded as NCCL discards it: 0 bytes, and not a
    send_recv or barrier (`KEPT_WHEN_EMPTY`; module docstring, "Empty collectives")."""
    return size_bytes == 0 and kind not in KEPT_WHEN_EMPTY


def _restrict_groups(groups: Sequence[Sequence[int]], ranks: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """`groups` limited to `ranks` (empty groups dropped); every rank must be in exactly one group."""
    members = set(ranks)
    seen: dict[int, int] = {}
    out = []
    for i, group in enumerate(groups):
        for r in group:
            if r in seen:
                raise TransferError(f"rank {r} is in groups {seen[r]} and {i}")
            seen[r] = i
        kept = tuple(r for r in group if r in members)
        if kept:
            out.append(kept)
    missing = [r for r in ranks if r not in seen]
    if missing:
        raise TransferError(f"ranks {missing} are in no group of {[list(g) for g in groups]}")
    return tuple(out)


def resolve_algorithm(kind: str, algorithm: str = "auto",
                      groups: Sequence[Sequence[int]] | None = None) -> str:
    """The algorithm `schedule` runs. "auto" is the kind's first algorithm, except for all_reduce with
    `groups` (already restricted to the collective's ranks) of more than one group, all of one size
    above one rank: then `hierarchical`."""
    if kind not in ALGORITHMS:
        raise TransferError(f"unknown collective kind {kind!r}; known: {', '.join(KINDS)}")
    if algorithm == "auto":
        if kind == "all_reduce" and groups is not None and len(groups) > 1 \
                and len({len(g) for g in groups}) == 1 and len(groups[0]) > 1:
            return "hierarchical"
        return ALGORITHMS[kind][0]
    if algorithm not in ALGORITHMS[kind]:
        raise TransferError(f"unknown algorithm {algorithm!r} for {kind}; known: auto, "
                            f"{', '.join(ALGORITHMS[kind])}")
    return algorithm


def _checked(kind: str, size_bytes: int, ranks: list[int], algorithm: str,
             groups: Sequence[Sequence[int]] | None, pipeline_chunks: int
             ) -> tuple[tuple[tuple[int, ...], ...] | None, str]:
    """The arguments' checks shared by `schedule` and `schedule_columns`: (the groups restricted to
    the ranks, the algorithm resolved)."""
    if not ranks:
        raise TransferError(f"{kind}: no ranks")
    if len(set(ranks)) != len(ranks):
        raise TransferError(f"{kind}: duplicate ranks in {ranks}")
    if size_bytes < 0:
        raise TransferError(f"{kind}: size_bytes must be >= 0, got {size_bytes}")
    if pipeline_chunks < 1:
        raise TransferError(f"pipeline_chunks must be >= 1, got {pipeline_chunks}")
    local_groups = _restrict_groups(groups, ranks) if groups is not None else None
    return local_groups, resolve_algorithm(kind, algorithm, local_groups)


def schedule_columns(kind: str, size_bytes: int, ranks: Sequence[int], algorithm: str = "auto",
                     groups: Sequence[Sequence[int]] | None = None, root: int | None = None, *,
                     pipeline_chunks: int = DEFAULT_PIPELINE_CHUNKS,
                     servers: Sequence[Sequence[int]] | None = None, pxn: bool = True) -> TransferColumns:
    """The transfer DAG of one collective of `size_bytes` (nccl-tests convention) over `ranks`, as arrays.

    `groups`: the locality of the ranks (e.g. per leaf switch), used by `hierarchical` and by "auto" for
    all_reduce; it may cover more ranks than `ranks` (e.g. the whole job) and is restricted to them.
    `root`: for broadcast, reduce, gather, scatter (default ranks[0]); an error for other kinds.
    `pipeline_chunks`: chunks per pipelined stream (the broadcast/reduce chain).
    A collective NCCL discards (`discarded`: 0 bytes, not send_recv or barrier) is an empty DAG.
    `servers`: the job's ranks by server; a ring all-reduce, reduce-scatter or all-gather whose group has k > 1
    ranks on each of N > 1 servers runs as NCCL maps it, one ring per NIC (`nic_rings`), and an all-to-all over
    such a group as one group of sends (`_grouped_all_to_all`). `pxn`: NCCL's PXN (default on, as in NCCL): a
    ring's server exit and an all-to-all's piece for another rail cross NVLink to the GPU of the peer's rail and
    leave through its NIC; off, they leave through the sender's own NIC.
    """
    ranks = list(ranks)
    local_groups, algo = _checked(kind, size_bytes, ranks, algorithm, groups, pipeline_chunks)
    if root is not None and kind not in _ROOTED:
        raise TransferError(f"{kind} has no root (got root={root}); only {', '.join(_ROOTED)} have one")
    if root is not None and root not in ranks:
        raise TransferError(f"{kind}: root {root} is not one of the ranks {ranks}")
    start = ranks.index(root) if root is not None else 0
    from_root = ranks[start:] + ranks[:start]
    dag = DagBuilder()
    n = len(ranks)
    if discarded(kind, size_bytes):  # as NCCL: no transfer at all
        return dag.columns(ranks, f"{kind} {n} ranks 0 B (discarded: empty)")
    blocks = server_blocks(ranks, servers) if algo == "ring" and kind in NIC_RING_KINDS else None
    if blocks is not None:
        _nic_ring_collective(dag, kind, blocks, size_bytes, pxn)
        return dag.columns(ranks, f"{kind} ring {n} ranks {size_bytes} B, {len(blocks[0])} rings (one per NIC)")
    if kind == "all_reduce":
        if algo == "ring":
            _ring_all_reduce(dag, ranks, size_bytes, 0, {})
        elif algo == "tree":
            _tree_all_reduce(dag, ranks, size_bytes, server_blocks(ranks, servers))
        elif algo == "halving_doubling":
            _halving_doubling(dag, ranks, size_bytes)
        else:
            _hierarchical(dag, local_groups, size_bytes)
    elif kind in ("reduce_scatter", "all_gather") and algo == "pat":
        server_of = {r: i for i, members in enumerate(servers or ()) for r in members}
        on = [server_of[r] for r in ranks if r in server_of]
        if len(set(on)) < len(on):
            raise TransferError(f"{kind} pat: NCCL runs PAT only with one GPU per server (src/graph/tuning.cc:220, "
                                f"nNodes != nRanks), and this group has several in each server")
        _pat(dag, kind, ranks, size_bytes)
    elif kind == "reduce_scatter":
        _ring_reduce_scatter(dag, ranks, split_bytes(size_bytes, n), 0, {})
    elif kind == "all_gather":
        _ring_all_gather(dag, ranks, split_bytes(size_bytes, n), 0, {})
    elif kind == "all_to_all":
        blocks = server_blocks(ranks, servers) if algo == "pairwise" else None
        if blocks is not None:
            _grouped_all_to_all(dag, blocks, size_bytes, pxn)
            return dag.columns(ranks, f"{kind} grouped {n} ranks {size_bytes} B, {len(blocks[0])} per server"
                                      + (", PXN" if pxn else ""))
        _all_to_all(dag, ranks, size_bytes, pairwise=algo == "pairwise")
    elif kind == "broadcast":
        _chain(dag, from_root, size_bytes, pipeline_chunks)
    elif kind == "reduce":
        _chain(dag, from_root[::-1], size_bytes, pipeline_chunks)  # root+n-1 -> ... -> root+1 -> root
    elif kind in ("gather", "scatter"):
        pieces = split_bytes(size_bytes, n)
        for q in range(1, n):
            pos = (start + q) % n
            src, dst = (ranks[pos], ranks[start]) if kind == "gather" else (ranks[start], ranks[pos])
            dag.send(src, dst, pieces[pos], 0)
    elif kind == "send_recv":
        if n != 2:
            raise TransferError(f"send_recv needs exactly 2 ranks (sender, receiver), got {ranks}")
        dag.send(ranks[0], ranks[1], size_bytes, 0)
    else:
        _dissemination_barrier(dag, ranks)
    return dag.columns(ranks, f"{kind} {algo} {n} ranks {size_bytes} B")


def schedule(kind: str, size_bytes: int, ranks: Sequence[int], algorithm: str = "auto",
             groups: Sequence[Sequence[int]] | None = None, root: int | None = None, *,
             pipeline_chunks: int = DEFAULT_PIPELINE_CHUNKS,
             servers: Sequence[Sequence[int]] | None = None, pxn: bool = True) -> TransferDag:
    """`schedule_columns(...)` as `Transfer` objects (a `TransferDag`), transfer for transfer the same."""
    return schedule_columns(kind, size_bytes, ranks, algorithm, groups, root,
                            pipeline_chunks=pipeline_chunks, servers=servers, pxn=pxn).to_dag()
