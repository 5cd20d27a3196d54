"""NCCL's own cost model: which algorithm/protocol NCCL 2.30.7 picks for a collective, and its time estimate.

A pure-Python reproduction (no I/O) of NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027
(NCCL 2.30.7, same sources as tag v2.30.7-1): `ncclTopoTuneModel` (src/graph/tuning.cc:243-618) fills a
latency (us) and bandwidth (GB/s = 1e9 B/s) per (collective, algorithm, protocol); `ncclTopoGetAlgoTime`
(tuning.cc:630-655) turns one entry into a time for n bytes; `topoGetAlgoInfo` (src/enqueue.cc:2028-2046)
takes the argmin (line numbers: that commit). Inputs are what NCCL prints at init: node/rank counts and
the ring and tree search graphs ("Pattern 4, crossNic 0, nChannels 8, bw 48.0/48.0, type NVL/PXN").

Modelled: Tree, Ring and PAT x LL, LL128, Simple for the five collectives NCCL tunes, with the default
enable rules (tree only for all-reduce, tuning.cc:294-298; PAT only for all-gather/reduce-scatter, Simple,
one GPU per node, host network, sm >= 60, tuning.cc:215-223,302-304; LL128 only over NVB-or-better
intra-node and PXN-or-better (Hopper+, else PXB) inter-node paths, tuning.cc:517-536), the tree size
correction, the ring plateau and aggregated operations (tuning.cc:639-653). The bandwidth is what NCCL
stores and prints: for Ring and Tree already converted from bus to algorithm bandwidth (tuning.cc:376-382),
for PAT (all-gather/reduce-scatter) still bus bandwidth.

Not modelled, on purpose: NVLS and NVLSTree need NVLink SHARP (NVSwitch multicast) and NVLS is off on
multi-node without CollNet (tuning.cc:504-506); CollNetDirect/CollNetChain need a CollNet (SHARP) plugin
and NCCL_COLLNET_ENABLE, which is 0 by default (tuning.cc:504-509). So the choice here is NCCL's for a
system without NVLS support (e.g. NCCL_NVLS_ENABLE=0, no NVSwitch) and without CollNet; on an H100
NVSwitch system NCCL would also weigh NVLS (one node) or NVLSTree (several nodes). Also not modelled:
NCCL_ALGO/NCCL_PROTO/NCCL_NET_OVERHEAD and other environment overrides, tuner plugins, the fp8 penalty
and PAT's exclusion for averaging reduce-scatter (enqueue.cc:2010-2020), LL128's CUDA 11.8 exception
(tuning.cc:534) and mixed compute capabilities; nodes must hold equal rank counts.

Sizes (`n_bytes`) follow nccl-tests: the buffer for all_reduce/broadcast/reduce, the whole output for
all_gather and the whole input for reduce_scatter. That is exactly NCCL's nBytes = count * typesize *
(nRanks for all-gather/reduce-scatter, else 1) (enqueue.cc:2127, src/include/enqueue.h:39-41). NCCL's own
"AllGather: N Bytes -> Algo ..." line prints count * typesize, i.e. n_bytes / n_ranks (enqueue.cc:822-823).
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

ALGORITHMS = ("tree", "ring", "pat")  # NCCL_ALGO_TREE=0, RING=1, PAT=6 (src/include/plugin/nccl_tuner.h:28-34)
PROTOCOLS = ("LL", "LL128", "Simple")  # NCCL_PROTO_LL=0, LL128=1, SIMPLE=2 (nccl_tuner.h:38-40)
COLLECTIVES = ("broadcast", "reduce", "all_gather", "reduce_scatter", "all_reduce")  # ncclFunc 0..4
NCCL_FUNC_NAMES = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")  # src/init.cc:52
NCCL_ALGO_NAMES = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")  # init.cc:53
ALGO_KEYS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvls_tree", "pat")
PATH_TYPES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS", "NET", "DIS")  # topo.cc:34
CPUS = ("intel", "amd", "arm", "power")
_AR, _AG, _RS = "all_reduce", "all_gather", "reduce_scatter"

# ncclTunerConstantsDefaults, tuning.cc:148-212; rows (LL, LL128, Simple), index [compCapIdx][min(nNodes,3)-1].
BASE_LAT = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "pat": (8.0, 8.0, 8.0)}  # tuning.cc:151-154
HW_LAT = {  # tuning.cc:157-175
    "nvlink": {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "pat": (0.0, 0.0, 4.0)},
    "pci": {"tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "pat": (0.0, 0.0, 4.0)},
    "net": {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "pat": (0.0, 0.0, 14.0)},
}
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))  # :178-183
PER_CH_MAX_RING_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)  # tuning.cc:185-190
PER_CH_MAX_TREE_LL128 = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))  # :192-197
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))  # :199-204
TREE_CORRECTION = (  # powers of two from 64 B, tuning.cc:623-627
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)
PCI_BW_GBps = 12.0  # src/graph/topo.h:25, the 256-thread Simple ring threshold (tuning.cc:244-245)
MAX_CHANNELS = 64  # src/include/device.h:91
# NCCL_MAX_DEV_WORK_BATCH_BYTES (1024) / sizeof(ncclDevWorkColl) (128 bytes), device.h:284-320,389-390
MAX_DEV_WORK_BATCH_COLLS = 8
TREE_PATTERN = 3  # NCCL_TOPO_PATTERN_TREE, src/include/graph.h:166 (all NIC traffic through one GPU)


def _require_int(name: str, value: object, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _require_in(name: str, value: object, options: tuple[object, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name} must be one of {options}, got {value!r}")


@dataclass(frozen=True)
class Graph:
    """One search graph as NCCL prints it (src/graph/search.cc:1319): nChannels, bw intra/inter, types.

    `pattern` is the printed Pattern (tree: 1 balanced, 2 split, 3 tree; ring 4; 0 = not given),
    `latency_inter_us` is graph->latencyInter (0 unless the net plugin reports a latency),
    `same_channels` the printed sameChannels flag. NCCL takes the minimum nChannels/bw over ranks."""

    n_channels: int
    bw_intra_GBps: float
    bw_inter_GBps: float
    type_intra: str = "NVL"
    type_inter: str = "PXN"
    pattern: int = 0
    latency_inter_us: float = 0.0
    same_channels: bool = True

    def __post_init__(self) -> None:
        _require_int("n_channels", self.n_channels)
        for name in ("bw_intra_GBps", "bw_inter_GBps"):
            bw = getattr(self, name)
            if not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {bw!r}")
        _require_in("type_intra", self.type_intra, PATH_TYPES)
        _require_in("type_inter", self.type_inter, PATH_TYPES)
        _require_in("pattern (0 = unknown)", self.pattern, tuple(range(7)))
        if not math.isfinite(self.latency_inter_us) or self.latency_inter_us < 0:
            raise ValueError(f"latency_inter_us must be >= 0, got {self.latency_inter_us!r}")


@dataclass(frozen=True)
class Machine:
    """A communicator: `n_ranks` GPUs on `n_nodes` nodes (equal ranks per node), all of one compute
    capability `cuda_arch` (90 = H100), host CPU vendor `cpu`; `net_offload` = a device-offload network
    (NCCL_NET_DEVICE_UNPACK, e.g. TCPX), which disables PAT (tuning.cc:221)."""

    n_ranks: int
    n_nodes: int
    cuda_arch: int = 90
    cpu: str = "intel"
    net_offload: bool = False

    def __post_init__(self) -> None:
        _require_int("n_ranks", self.n_ranks)
        _require_int("n_nodes", self.n_nodes)
        _require_int("cuda_arch (major*10+minor, e.g. 90 for H100)", self.cuda_arch, 30)
        if self.n_nodes > self.n_ranks:
            raise ValueError(f"n_nodes ({self.n_nodes}) cannot exceed n_ranks ({self.n_ranks})")
        if self.n_ranks % self.n_nodes:
            raise ValueError(f"n_ranks ({self.n_ranks}) must be divisible by n_nodes ({self.n_nodes})")
        _require_in("cpu", self.cpu, CPUS)

    @property
    def cc_index(self) -> int:  # tuning.cc:263-266
        return 3 if self.cuda_arch >= 100 else 2 if self.cuda_arch >= 90 else 1 if self.cuda_arch >= 80 else 0


@dataclass(frozen=True)
class Entry:
    latency_us: float
    bw_GBps: float  # 0.0: computed but disabled, as NCCL's comm->bandwidths


@dataclass(frozen=True)
class TuningTable:
    """`entries` holds every (collective, algo, proto) NCCL computes; combinations it skips (e.g. tree
    broadcast) are absent and print as 0.0/0.0. `comm_channels` is comm->nChannels (ring plateau)."""

    machine: Machine
    comm_channels: int
    entries: Mapping[tuple[str, str, str], Entry] = field(default_factory=dict)
    max_threads: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    algo: str
    proto: str
    time_us: float
    times: Mapping[tuple[str, str], float]  # every candidate's ncclTopoGetAlgoTime (-1: disabled)


def _log2i(n: int) -> int:  # log2Down, src/include/bitops.h:292-322 (host: -1 for 0)
    return n.bit_length() - 1


def _ll128_enabled(m: Machine, g: Graph) -> bool:  # tuning.cc:518-536 with NCCL_LL128_C2C=1
    worst_inter = "PXN" if m.cuda_arch >= 90 else "PXB"
    return (PATH_TYPES.index(g.type_inter) <= PATH_TYPES.index(worst_inter)
            and PATH_TYPES.index(g.type_intra) <= PATH_TYPES.index("NVB") and m.cuda_arch >= 70)


def _hw_lat(m: Machine, hw: str, algo: str, p: int) -> float:  # POWER: PCI tree Simple = ring's, tuning.cc:277-280
    return HW_LAT[hw]["ring" if (m.cpu, hw, algo, p) == ("power", "pci", "tree", 2) else algo][p]


def _algo_bw(m: Machine, g: Graph, n_ch: int, tree_pattern: int, coll: str, algo: str, p: int) -> float:
    """Bandwidth as stored in comm->bandwidths, tuning.cc:306-382."""
    idx2 = min(m.n_nodes, 3) - 1  # tuning.cc:267
    idx1 = m.cc_index if m.n_nodes == 1 else (1 if m.cpu == "amd" else 0)  # tuning.cc:269-271
    ll_max = LL_MAX_BWS[idx1][idx2]
    bus = n_ch * (g.bw_intra_GBps if m.n_nodes <= 2 else g.bw_inter_GBps)  # tuning.cc:306,324
    if algo == "ring" and p == 0:
        bus = min(ll_max, bus * .5)  # tuning.cc:327
    if algo == "ring" and p == 1:
        bus = min(bus * .92, n_ch * PER_CH_MAX_RING_LL128[m.cc_index][idx2])  # tuning.cc:328-329
    if algo == "tree" and coll == _AR:
        bus = min(bus * .92, n_ch * PER_CH_MAX_TREE[m.cc_index][idx2])  # tuning.cc:330-331
    if algo == "tree" and p == 0:
        bus = min(bus / 3.8, ll_max)  # tuning.cc:332
    if algo == "tree" and p == 1:
        factor = 7.0 / 9.0 if m.n_nodes == 1 else 120.0 / 128.0  # tuning.cc:333-335
        bus = min(bus * factor, n_ch * PER_CH_MAX_TREE_LL128[m.cc_index][idx2])
    if algo == "tree" and tree_pattern == TREE_PATTERN:
        bus *= .85  # tuning.cc:336
    if algo == "pat":
        bus *= .75  # tuning.cc:337
    if not (algo != "ring" and coll in (_AG, _RS)):  # bus -> algorithm bandwidth, tuning.cc:376-382
        bus *= m.n_ranks / _nsteps(m, coll) if algo == "ring" else .5
    return bus


def _nsteps(m: Machine, coll: str) -> int:  # tuning.cc:289-291
    return 2 * (m.n_ranks - 1) if coll == _AR else m.n_ranks - 1 if coll in (_AG, _RS) else m.n_ranks


def _latency(m: Machine, g: Graph, coll: str, algo: str, p: int) -> float:
    """comm->latencies, tuning.cc:384-435."""
    intra_hw = "nvlink" if g.type_intra == "NVL" else "pci"  # tuning.cc:285 (compares with LINK_NVL)
    hw = intra_hw if m.n_nodes == 1 else "net"  # tuning.cc:286
    ppn = m.n_ranks // m.n_nodes
    lat = BASE_LAT[algo][p]
    intra = _hw_lat(m, intra_hw, algo, p)
    # tuning.cc:387-391: ppn 1 exposes the tree's network latency; Simple adds latencyInter again (flush)
    inter = _hw_lat(m, "net", "tree" if ppn == 1 else algo, p) + g.latency_inter_us * (2 if p == 2 else 1)
    nsteps = _nsteps(m, coll)
    if algo == "ring" and coll in ("broadcast", "reduce"):  # tuning.cc:394-402
        step = _hw_lat(m, hw, "ring", p)
        return lat + (step if g.same_channels else nsteps * (_hw_lat(m, hw, "tree", p) if p == 2 else step))
    if algo == "ring":  # tuning.cc:404-412
        overhead = (2.0 if m.cpu == "amd" else 1.0) * (3 if p == 2 else 1)  # getNetOverhead, :228-233
        intra = max(intra, overhead if m.n_nodes > 1 else 0.0)
        n_inter = 0 if m.n_nodes == 1 else 2 * (m.n_nodes - 1) if coll == _AR else m.n_nodes - 1
        return lat + (nsteps - n_inter) * intra + n_inter * inter
    if algo == "tree":  # tuning.cc:415-417
        return lat + 2 * ((ppn - 1) * intra + _log2i(m.n_nodes) * inter) if coll == _AR else lat
    return lat + _log2i(m.n_nodes) * (inter / 3.5) + m.n_ranks * 2.8  # PAT, tuning.cc:430-433


def tune(machine: Machine, graphs: Mapping[str, Graph], comm_channels: int | None = None) -> TuningTable:
    """ncclTopoTuneModel for Tree/Ring/PAT. `graphs` needs "ring" and "tree" (PAT uses the tree graph,
    init.cc:980-981); both get min(nChannels) as NCCL aligns them (init.cc:1459). `comm_channels`
    overrides comm->nChannels (default: connect.cc:460-505 without unpack nets or env overrides)."""
    if set(graphs) - {"ring", "tree"} or not {"ring", "tree"} <= set(graphs):
        raise ValueError(f"graphs must have exactly the keys 'ring' and 'tree', got {sorted(graphs)}")
    ring, tree = graphs["ring"], graphs["tree"]
    if not isinstance(ring, Graph) or not isinstance(tree, Graph):
        raise TypeError("graphs values must be Graph instances")
    n_ch = min(ring.n_channels, tree.n_channels)
    if comm_channels is None:  # connect.cc:460 (duplication), 480-483 (Hopper+ multi-node), 503 (max 64)
        comm_channels = min(MAX_CHANNELS, 2 * n_ch)
        if machine.cuda_arch >= 90 and machine.n_nodes > 1 and ring.bw_intra_GBps > 45.0 and comm_channels < 16:
            comm_channels *= 2
    _require_int("comm_channels", comm_channels)
    simple_ring = 256 if ring.bw_intra_GBps * n_ch <= PCI_BW_GBps else 512  # tuning.cc:244-247
    threads = {("tree", "LL"): 512, ("tree", "LL128"): 640, ("tree", "Simple"): 512, ("ring", "LL"): 512,
               ("ring", "LL128"): 640, ("ring", "Simple"): simple_ring}  # tuning.cc:248-257, device.h:93-114
    threads.update({(a, "Simple"): 640 for a in ALGO_KEYS[2:6]})
    entries: dict[tuple[str, str, str], Entry] = {}
    # ncclPatEnable, tuning.cc:216-223 (NCCL_PAT_ENABLE default 2)
    pat_on = machine.cuda_arch >= 60 and machine.n_nodes == machine.n_ranks and not machine.net_offload
    if machine.n_ranks <= 1:  # tuning.cc:261
        return TuningTable(machine, comm_channels, entries, threads)
    for coll in COLLECTIVES:
        for algo in ALGORITHMS:
            if (algo == "tree" and coll != _AR) or (algo == "pat" and coll not in (_AG, _RS)):
                continue  # tuning.cc:294-298
            g = ring if algo == "ring" else tree
            for p, proto in enumerate(PROTOCOLS):
                if algo == "pat" and (p != 2 or not pat_on):
                    continue  # tuning.cc:302-304
                bw = _algo_bw(machine, g, n_ch, tree.pattern, coll, algo, p)
                if p == 1 and not _ll128_enabled(machine, g):
                    bw = 0.0  # tuning.cc:537
                entries[(coll, algo, proto)] = Entry(_latency(machine, g, coll, algo, p), bw)
    return TuningTable(machine, comm_channels, entries, threads)


def algo_time_us(table: TuningTable, collective: str, algo: str, proto: str, n_bytes: int,
                 num_pipe_ops: int = 1) -> float:
    """ncclTopoGetAlgoTime (tuning.cc:630-655): lat * latCount + n_bytes / (1000 * bw) in us, -1 when
    disabled. `n_bytes` is NCCL's nBytes = the nccl-tests size (see module docstring); `num_pipe_ops`
    is the number of aggregated operations (1 for a lone call)."""
    for name, value, options in (("collective", collective, COLLECTIVES), ("algo", algo, ALGORITHMS),
                                 ("proto", proto, PROTOCOLS)):
        _require_in(name, value, options)
    _require_int("n_bytes", n_bytes, 0)
    _require_int("num_pipe_ops", num_pipe_ops)
    entry = table.entries.get((collective, algo, proto))
    if entry is None or entry.bw_GBps == 0:
        return -1.0  # tuning.cc:635-638
    bw, lat = entry.bw_GBps, entry.latency_us
    log_size = _log2i(n_bytes >> 6)
    if algo == "tree" and collective == _AR and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[PROTOCOLS.index(proto)][log_size]  # tuning.cc:639-642
    m = table.machine
    if (algo == "ring" and proto == "Simple" and m.n_nodes > 1 and collective == _AR
            and n_bytes // (table.comm_channels * m.n_ranks) >= 64):
        lat *= 1.9 if m.cuda_arch < 80 else 1.4  # plateau, tuning.cc:647-650
    lat_count = num_pipe_ops if algo == "ring" else -(-num_pipe_ops // MAX_DEV_WORK_BATCH_COLLS)  # :652
    return lat * lat_count + n_bytes / (1000 * bw)


def choose(table: TuningTable, collective: str, n_bytes: int, algos: tuple[str, ...] | None = None,
           num_pipe_ops: int = 1) -> Choice:
    """topoGetAlgoInfo's argmin (enqueue.cc:2032-2044): lowest non-negative time, first in NCCL order
    (tree, ring, pat x LL, LL128, Simple) on ties. `algos` restricts the candidates (like NCCL_ALGO)."""
    _require_in("collective", collective, COLLECTIVES)
    candidates = ALGORITHMS if algos is None else tuple(algos)
    for a in candidates:
        _require_in("algo", a, ALGORITHMS)
    if table.machine.n_ranks == 1:  # enqueue.cc:1993-1996
        return Choice("ring", "Simple", 0.0, {("ring", "Simple"): 0.0})
    times = {(a, p): algo_time_us(table, collective, a, p, n_bytes, num_pipe_ops)
             for a in ALGORITHMS if a in candidates for p in PROTOCOLS}
    best: tuple[str, str] | None = None
    for key, t in times.items():
        if t >= 0 and (best is None or t < times[best]):
            best = key
    if best is None:
        raise ValueError(f"no algorithm/protocol available for {collective} among {candidates}")
    return Choice(best[0], best[1], times[best], times)


def format_table(table: TuningTable) -> str:
    """The NCCL_DEBUG_SUBSYS=TUNING table (tuning.cc:543-585) without the "host:pid:tid [dev] NCCL INFO"
    prefix: all seven NCCL algorithms in blocks of three; the ones not modelled print 0.0/0.0."""
    lines, off = [], Entry(0.0, 0.0)
    for block in range(0, len(ALGO_KEYS), 3):
        algos = ALGO_KEYS[block:block + 3]
        lines.append("  Algorithm   |" + "".join(f" {'':>14}   {NCCL_ALGO_NAMES[block + i]:>14}   {'':>14} |"
                                                  for i in range(len(algos))))
        lines.append("  Protocol    |" + "".join(f" {p:>14} |" for _ in range(3) for p in PROTOCOLS))
        lines.append(" Max NThreads |" + "".join(f" {table.max_threads.get((a, p), 0):>14d} |"
                                                 for a in algos for p in PROTOCOLS))
        for coll, name in zip(COLLECTIVES, NCCL_FUNC_NAMES):
            cells = [table.entries.get((coll, a, p), off) for a in algos for p in PROTOCOLS]
            lines.append(f"{name:>13} |" + "".join(f"{e.latency_us:8.1f}/{e.bw_GBps:6.1f} |" for e in cells))
    return "\n".join(lines)


_ROW = re.compile(r"(?:^|\s)(Algorithm|Protocol|Max NThreads|Broadcast|ReduceScatter|AllGather|AllReduce|Reduce)"
                  r"\s+\|(.*)$")
_CELL = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*/\s*(-?\d+(?:\.\d+)?)\s*$")


def parse_tuning_log(text: str) -> dict[tuple[str, str, str], tuple[float, float]]:
    """Parse NCCL's printed tuning table(s) out of a log: {(collective, algo, proto): (latency_us, bw_GBps)}
    with keys as in ALGO_KEYS/COLLECTIVES/PROTOCOLS (all seven NCCL algorithms). Log prefixes are ignored.
    Raises ValueError when no table is found, a row is malformed, or two tables in the text disagree."""
    out: dict[tuple[str, str, str], tuple[float, float]] = {}
    algos: list[str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        match = _ROW.search(line)
        if match is None:
            continue
        kind, cells = match.group(1), match.group(2).split("|")
        if not cells[-1].strip():
            cells = cells[:-1]
        if kind == "Algorithm":
            names = [c.strip() for c in cells]
            unknown = [x for x in names if x not in NCCL_ALGO_NAMES]
            if not names or unknown:
                raise ValueError(f"line {n}: unknown algorithm(s) {unknown or names} in tuning header")
            algos = [ALGO_KEYS[NCCL_ALGO_NAMES.index(x)] for x in names]
        elif kind in ("Protocol", "Max NThreads"):
            if algos is None:
                raise ValueError(f"line {n}: '{kind}' row before any 'Algorithm' header")
        elif algos is not None:
            if len(cells) != 3 * len(algos):
                raise ValueError(f"line {n}: {kind} row has {len(cells)} cells, expected {3 * len(algos)}")
            coll = COLLECTIVES[NCCL_FUNC_NAMES.index(kind)]
            for i, cell in enumerate(cells):
                value = _CELL.match(cell)
                if value is None:
                    raise ValueError(f"line {n}: cell {cell.strip()!r} is not 'latency/bandwidth'")
                key = (coll, algos[i // 3], PROTOCOLS[i % 3])
                pair = (float(value.group(1)), float(value.group(2)))
                if out.setdefault(key, pair) != pair:
                    raise ValueError(f"line {n}: {key} is {pair} but {out[key]} earlier: several different "
                                     "tables in the text; pass one communicator's table")
            if kind == NCCL_FUNC_NAMES[-1]:
                algos = None  # a block ends with AllReduce (tuning.cc:572-583)
    if not out:
        raise ValueError("no NCCL tuning table ('Algorithm | ...' header followed by collective rows) found")
    return out
