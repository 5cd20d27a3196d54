"""The simulator calibrated against the emulator, and the two backends run side by side.

    cal = calibrate([(topofile.load("dual-plane-16"), "adaptive"), (topofile.load("pyramid-16"), "adaptive")])
    rows = crosscheck(workload, "trace.json.gz", topofile.load("pyramid-16"), "ecmp", ReplayOptions(), cal)

The simulator (`fabric.flowsim`) moves fluid flows at max-min fair shares of the link rates. The
emulator adds what that model leaves out, and the calibration fits it as three parameters:
- `goodput_share` g: the transfers' bytes per byte a link carries (the rest: Ethernet, IP and TCP
  headers, and the ACKs that share a host's egress);
- `per_transfer_emu_s` a: a fixed delay per transfer (the agents' reaction, TCP's first round trips);
- `per_hop_emu_s` h: a delay per link of a transfer's path (a frame serialised at the emulated link
  rate on every hop before the next may forward it).
a and h are in emulated seconds, because that is where the emulator's latencies live: a replay at
dilation D sees them as a / D and h / D real seconds (`sim_options`), so the simulator is given them
at the dilation of the run it is compared with. g is the same in both units.

Fitted on microbenchmarks only (`MICRO_TRANSFER_EMU_S`): one ring all-reduce over every host of each
fabric given, at several sizes, on the idle emulated fabric, at a fixed dilation so the sizes differ
in emulated time, each `MICRO_REPEAT` times, the fastest taken (stalls only add time). For each, the simulator gives the three features of the model, linear in (1/g, a, h)
for a collective whose steps are alike (a ring): T0, its time with no overhead at the links' full
rate; S, the transfers on its critical path (seconds added per second of per-transfer delay); H, the
hops on its critical path. The fit is the least-squares solution of E = T0 / g + S a / D + H h / D
(E the emulated duration in real units), each sample weighted by 1 / E (relative errors), with
g <= 1 and a, h >= 0 (`scipy.optimize.lsq_linear`). h is kept only where the samples tell it apart
from a (`HOP_SIGNIFICANCE`): a ring has the same S at every size and one H per fabric, so only the
fabrics' different hop counts (4 and 6 on the 16-host ones) separate the two, and the emulated
difference between them was within the noise in every run measured (p 0.6-1.0); a per-hop delay
fitted to that noise (up to 14 ms emulated, with a cut to 1 ms per transfer) put 24% latency into a
ResNet all-reduce on pyramid-16 where the emulator shows none. Otherwise the fit is (1/g, a) with h = 0. Validation (`crosscheck`) runs traces the
calibration never saw on both backends and gives the difference per collective, and each collective's
latency share (of its simulated time, what the delays add): where that is above a quarter
(`LATENCY_BOUND_SHARE`, e.g. a broadcast of a few hundred bytes down a pipelined chain) the backends
differ by design: the simulator charges the fitted per-transfer delay to every chunk, a fluid
average of what the emulator spends per transfer. A collective scheduled as a pipelined chain
(`PIPELINED_KINDS`: broadcast and reduce) is compared by neither measure (`comparable`): its chunks
are small and each one's delays chain down the hops.

The simulator runs cut-through here (`CUT_THROUGH`, `SimOptions.cut_through`), as the replay's
agents forward: a transfer begins with what it depends on, holds its pair's connections for the
per-transfer delay before its first byte (so a pair's transfers, taken in turn, each pay it), and
is delivered the per-hop latency after its last byte, no earlier than what it depends on. A ring
then has S = 2(n-1) as before and H = one path's hops.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fabric.errors import FabriclabError
from fabric.flowsim import SimOptions
from fabric.model import Fabric
from traffic.formatting import format_us
from traffic.replay import ReplayOptions
from traffic.replay.plan import default_mbps_per_gbps
from traffic.results import RunResult
from traffic.workload import Collective, RankTrace, Step, Workload

#: The microbenchmarks: one ring all-reduce per entry, sized so that each of its transfers takes this
#: long on an emulated host's NICs (all of them) at the replay's default link scale.
MICRO_TRANSFER_EMU_S = (0.05, 0.15, 0.45)
#: The dilation the microbenchmarks run at (any fixed value: the sizes are chosen in emulated time).
MICRO_DILATION = 100_000.0
#: Each microbenchmark runs this many times; the fit takes the fastest, because the userspace datapath
#: stalls for tens of milliseconds with no fault (docs/emulation.md), which only ever adds time.
MICRO_REPEAT = 2
#: A delay added in the simulator to measure a collective's sensitivity to it (features S and H), seconds:
#: small against a step (the microbenchmarks' shortest transfer is ~0.5 us real), because cut-through
#: the sensitivity depends on the delay's size (a latency longer than a step chains from step to step)
PROBE_S = 1e-8
CALIBRATION_VERSION = 1
#: The per-hop delay is fitted only if adding it to (1/g, a) lowers the weighted squared residual
#: significantly: an F-test of the nested least-squares fits, (RSS_2 - RSS_3) / (RSS_3 / (n - 3)) against
#: F(1, n - 3), at this p-value or below (with 3 samples there is nothing left to test it with: h = 0).
HOP_SIGNIFICANCE = 0.05
#: The simulator runs the calibration and the cross-check cut-through (`SimOptions.cut_through`), as
#: the replay's agents forward. Store and forward ran DLRM's pairwise all-to-all's 15 rounds one after
#: another where the emulator overlaps them: on pyramid-16 the simulator was 34-38% slower than the
#: emulator there; cut-through, refitted on the same run's microbenchmarks, 5-8% faster (ring
#: all-reduces unchanged, within 2.5%).
CUT_THROUGH = True
#: A collective whose simulated time is more than this share per-transfer and per-hop delay is
#: latency-bound: there the two backends differ by design (the simulator charges the fitted delay to
#: every transfer, pipelined chunks included). Measured (store and forward): ring all-reduces of 8-31 MB
#: 3-11%, DLRM's all-to-alls 1%, ResNet's broadcasts of 212 kB and 424 B 52% and 100%.
LATENCY_BOUND_SHARE = 0.25
#: Collectives scheduled as a pipelined chain (`traffic.collectives`): small chunks whose delays chain
#: down the hops, so their times differ by design (module docstring; measured: ResNet-50's 212 kB
#: broadcast down 16 ranks 2.4-3.7x the emulator's store and forward, 1.5-1.9x cut-through)
PIPELINED_KINDS = ("broadcast", "reduce")


class CalibrationError(FabriclabError):
    """A calibration that cannot be made or read; the message names the problem."""


@dataclass(frozen=True)
class Sample:
    """One microbenchmark: a collective on one fabric, as emulated and as the simulator's features."""

    topology: str
    routing: str
    kind: str
    size_bytes: int  # real (nccl-tests size)
    dilation: float
    emulated_us: float  # the emulated duration, real units
    t0_us: float  # simulated, no overheads, links at their full rate
    transfers_on_path: float  # S
    hops_on_path: float  # H


@dataclass(frozen=True)
class Calibration:
    goodput_share: float
    per_transfer_emu_s: float
    per_hop_emu_s: float
    samples: tuple[Sample, ...] = ()
    cut_through: bool = False  # the features (and so the fit) are the cut-through simulator's (CUT_THROUGH)

    def check(self) -> None:
        if not 0 < self.goodput_share <= 1:
            raise CalibrationError(f"goodput_share must be in (0, 1], got {self.goodput_share}")
        for name in ("per_transfer_emu_s", "per_hop_emu_s"):
            v = getattr(self, name)
            if not (v >= 0 and math.isfinite(v)):
                raise CalibrationError(f"{name} must be finite and >= 0, got {v}")

    def predict_us(self, s: Sample) -> float:
        """The calibrated model's duration of a sample, real microseconds."""
        return (s.t0_us / self.goodput_share
                + (s.transfers_on_path * self.per_transfer_emu_s + s.hops_on_path * self.per_hop_emu_s)
                / s.dilation * 1e6)

    def sim_options(self, dilation: float, base: SimOptions | None = None) -> SimOptions:
        """The simulator's options to compare with an emulated run at `dilation`."""
        return dataclasses.replace(base or SimOptions(), goodput_share=self.goodput_share,
                                   per_transfer_s=self.per_transfer_emu_s / dilation,
                                   per_hop_s=self.per_hop_emu_s / dilation, cut_through=self.cut_through)

    def to_dict(self) -> dict[str, Any]:
        return {"version": CALIBRATION_VERSION, "goodput_share": self.goodput_share,
                "per_transfer_emu_s": self.per_transfer_emu_s, "per_hop_emu_s": self.per_hop_emu_s,
                "cut_through": self.cut_through,
                "samples": [dataclasses.asdict(s) | {"predicted_us": self.predict_us(s)} for s in self.samples]}

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def read(cls, path: str | Path) -> Calibration:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CalibrationError(f"{p}: no such calibration file (make one with `fabriclab calibrate`)") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CalibrationError(f"{p}: not a calibration file (JSON): {e}") from None
        if not isinstance(data, dict) or data.get("version") != CALIBRATION_VERSION:
            raise CalibrationError(f"{p}: not a calibration file of version {CALIBRATION_VERSION}")
        try:
            fields = {f.name for f in dataclasses.fields(Sample)}
            samples = tuple(Sample(**{k: v for k, v in s.items() if k in fields}) for s in data.get("samples", []))
            cut_through = data.get("cut_through", False)  # a file from before: store-and-forward features
            if not isinstance(cut_through, bool):
                raise TypeError(f"cut_through must be true or false, got {cut_through!r}")
            cal = cls(float(data["goodput_share"]), float(data["per_transfer_emu_s"]), float(data["per_hop_emu_s"]),
                      samples, cut_through)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CalibrationError(f"{p}: a field is missing or malformed: {e}") from None
        cal.check()
        return cal


def fit(samples: Sequence[Sample], cut_through: bool = CUT_THROUGH) -> Calibration:
    """The least-squares (1/g, a, h) of the samples (module docstring); `cut_through`: the samples'
    features are the cut-through simulator's, and the calibration's simulator runs so."""
    from scipy.optimize import lsq_linear

    if len(samples) < 3:
        raise CalibrationError(f"a fit of three parameters needs at least 3 samples, got {len(samples)}")
    for s in samples:
        if not (s.emulated_us > 0 and s.t0_us > 0 and s.dilation > 0):
            raise CalibrationError(f"sample {s.kind} {s.size_bytes} B on {s.topology}: durations and dilation must "
                                   "be > 0")
    e = np.array([s.emulated_us for s in samples])
    a = np.array([[s.t0_us, s.transfers_on_path / s.dilation * 1e6, s.hops_on_path / s.dilation * 1e6]
                  for s in samples])
    w = 1.0 / e

    def solve(cols: int) -> tuple[np.ndarray, float]:
        res = lsq_linear(a[:, :cols] * w[:, None], e * w, bounds=([1.0] + [0.0] * (cols - 1), [np.inf] * cols))
        return res.x, float(np.sum(res.fun ** 2))

    (inv_g, per_transfer, per_hop), rss_3 = solve(3)
    if hop_p_value(solve(2)[1], rss_3, len(samples)) > HOP_SIGNIFICANCE:
        (inv_g, per_transfer), _ = solve(2)
        per_hop = 0.0
    inv_g, per_transfer, per_hop = float(inv_g), float(per_transfer), float(per_hop)
    cal = Calibration(min(1.0, 1.0 / inv_g), max(0.0, per_transfer), max(0.0, per_hop), tuple(samples), cut_through)
    cal.check()
    return cal


def hop_p_value(rss_2: float, rss_3: float, n: int) -> float:
    """The p-value of the per-hop term: the F-test of the fit without it (residual `rss_2`) against
    the fit with it (`rss_3`) on `n` samples (`HOP_SIGNIFICANCE`); 1.0 where it cannot be tested."""
    from scipy.stats import f

    if n <= 3:
        return 1.0
    if rss_3 <= 0.0:
        return 0.0 if rss_2 > 0.0 else 1.0
    return float(f.sf(max(0.0, rss_2 - rss_3) / (rss_3 / (n - 3)), 1, n - 3))


def micro_workload(n_ranks: int, sizes_bytes: Sequence[int]) -> Workload:
    """One ring all-reduce per size over ranks 0..n-1, one after another (no timings)."""
    colls = tuple(Collective("all_reduce", size, "float32", tuple(range(n_ranks)), "0", name=f"micro {size} B")
                  for size in sizes_bytes)
    step = Step(0, None, (), colls)
    return Workload("microbenchmarks", "fabriclab.calibrate", "synthetic", n_ranks,
                    tuple(RankTrace(r, (step,)) for r in range(n_ranks)), False)


def micro_sizes_bytes(fabric: Fabric, dilation: float = MICRO_DILATION,
                      transfer_emu_s: Sequence[float] = MICRO_TRANSFER_EMU_S) -> list[int]:
    """Real all-reduce sizes whose ring transfers (size / hosts) take `transfer_emu_s` each on one
    emulated host's NICs together, at the replay's default link scale and `dilation`."""
    scale = default_mbps_per_gbps(fabric)
    n = len(fabric.hosts)
    host_bps = min(sum(p.rate_gbps for p in fabric.nics_of[h.name]) for h in fabric.hosts) * scale * 1e6
    bytes_scale = dilation * scale / 1000
    return [int(round(t * host_bps / 8 * n / bytes_scale)) for t in transfer_emu_s]


def features(workload: Workload, fabric: Fabric, routing: str, options: ReplayOptions,
             cut_through: bool = CUT_THROUGH) -> list[tuple[float, float, float]]:
    """Per collective of the workload: (T0 us, S, H) from the simulator (module docstring), cut-through
    or store and forward."""
    from fabriclab.backends import Simulated, run_workload

    def durations(sim: SimOptions) -> list[float]:
        res = run_workload(workload, "microbenchmarks", fabric, routing, options, Simulated(sim)).result
        return [c.duration_real_us for c in res.collectives]

    base = SimOptions(poll_s=0.0, cut_through=cut_through)
    t0 = durations(base)
    with_a = durations(dataclasses.replace(base, per_transfer_s=PROBE_S))
    with_h = durations(dataclasses.replace(base, per_hop_s=PROBE_S))
    return [(t, (ta - t) / (PROBE_S * 1e6), (th - t) / (PROBE_S * 1e6)) for t, ta, th in zip(t0, with_a, with_h)]


EmulatedRun = Callable[[Workload, Fabric, str, ReplayOptions], RunResult]


def calibrate(fabrics: Sequence[tuple[Fabric, str]], run_emulated: EmulatedRun,
              dilation: float = MICRO_DILATION, log: Callable[[str], None] | None = None,
              repeat: int = MICRO_REPEAT, cut_through: bool = CUT_THROUGH) -> Calibration:
    """Run the microbenchmarks on each (fabric, routing) with `run_emulated` (the emulation replay),
    `repeat` times each, take the simulator's features of the same collectives, and fit to the fastest
    emulated run of each."""
    if repeat < 1:
        raise CalibrationError(f"repeat must be >= 1, got {repeat}")
    samples: list[Sample] = []
    for fab, routing in fabrics:
        sizes = micro_sizes_bytes(fab, dilation)
        w = micro_workload(len(fab.hosts), sizes)
        opts = ReplayOptions(ranks=len(fab.hosts), dilation=dilation, ports="planned", algorithm="ring")
        if log:
            log(f"microbenchmarks on {fab.name} ({routing}): ring all-reduce of {', '.join(map(str, sizes))} B "
                f"at dilation {dilation:g}, {repeat} time(s) each")
        emulated = run_emulated(w, fab, routing, dataclasses.replace(opts, repeat=repeat))
        feats = features(w, fab, routing, opts, cut_through)
        colls = sorted(emulated.collectives, key=lambda c: c.index)
        if len(colls) != len(sizes) * repeat:
            raise CalibrationError(f"{fab.name}: {len(colls)} collectives emulated, {len(sizes) * repeat} expected")
        # the steps loop: the i-th collective is the (i mod sizes)-th microbenchmark
        fastest: dict[int, float] = {}
        for i, c in enumerate(colls):
            if c.size_bytes != sizes[i % len(sizes)]:
                raise CalibrationError(f"{fab.name}: collective {i} has {c.size_bytes} B, "
                                       f"{sizes[i % len(sizes)]} B expected")
            fastest[i % len(sizes)] = min(fastest.get(i % len(sizes), math.inf), c.duration_real_us)
        for k, (t0, s, h) in enumerate(feats):
            samples.append(Sample(fab.name, routing, colls[k].kind, sizes[k], dilation, fastest[k], t0, s, h))
    return fit(samples, cut_through)


@dataclass(frozen=True)
class CrossRow:
    index: int
    step: int
    kind: str
    size_bytes: int
    emulated_us: float
    simulated_us: float
    latency_share: float = 0.0  # of the simulated time, what the per-transfer and per-hop delays add

    @property
    def bandwidth_bound(self) -> bool:
        """The delays make at most a quarter of the simulated time (LATENCY_BOUND_SHARE)."""
        return self.latency_share <= LATENCY_BOUND_SHARE

    @property
    def comparable(self) -> bool:
        """Bandwidth-bound and not a pipelined chain (`PIPELINED_KINDS`): where the two backends'
        models agree and their times should too."""
        return self.bandwidth_bound and self.kind not in PIPELINED_KINDS

    @property
    def difference(self) -> float:
        """(simulated - emulated) / emulated."""
        return (self.simulated_us - self.emulated_us) / self.emulated_us if self.emulated_us > 0 else math.nan


def crosscheck_rows(emulated: RunResult, simulated: RunResult, bandwidth_only: RunResult | None = None) -> list[CrossRow]:
    """The two runs' collectives side by side (the same plan: the same calls in the same order);
    `bandwidth_only`: the simulation without the delays, for each collective's latency share."""
    a = sorted(emulated.collectives, key=lambda c: c.index)
    b = sorted(simulated.collectives, key=lambda c: c.index)
    bw = sorted(bandwidth_only.collectives, key=lambda c: c.index) if bandwidth_only is not None else b
    if not [(c.kind, c.size_bytes) for c in a] == [(c.kind, c.size_bytes) for c in b] == \
            [(c.kind, c.size_bytes) for c in bw]:
        raise CalibrationError("the emulated and simulated runs have different collectives")
    return [CrossRow(x.index, x.step, x.kind, x.size_bytes, x.duration_real_us, y.duration_real_us,
                     1.0 - z.duration_real_us / y.duration_real_us if y.duration_real_us > 0 else 0.0)
            for x, y, z in zip(a, b, bw)]


def crosscheck(workload: Workload, label: str, fabric: Fabric, routing: str, options: ReplayOptions, cal: Calibration,
               run_emulated: EmulatedRun) -> tuple[list[CrossRow], RunResult, RunResult]:
    """`workload` on the emulator (`run_emulated`), then on the simulator calibrated for that run's dilation."""
    from fabriclab.backends import Simulated, run_workload

    emulated = run_emulated(workload, fabric, routing, options)
    sim = cal.sim_options(emulated.meta.dilation, SimOptions(poll_s=0.0))
    simulated = run_workload(workload, label, fabric, routing, options, Simulated(sim)).result
    bandwidth_only = run_workload(workload, label, fabric, routing, options,
                                  Simulated(dataclasses.replace(sim, per_transfer_s=0.0, per_hop_s=0.0))).result
    return crosscheck_rows(emulated, simulated, bandwidth_only), emulated, simulated


def format_rows(rows: Sequence[CrossRow]) -> str:
    lines = [f"{'#':>3} {'step':>4} {'kind':<14} {'size B':>12} {'emulated':>12} {'simulated':>13} {'diff':>7}"
             f" {'latency':>8}"]
    for r in rows:
        lines.append(f"{r.index:>3} {r.step:>4} {r.kind:<14} {r.size_bytes:>12} {format_us(r.emulated_us):>12} "
                     f"{format_us(r.simulated_us):>13} {r.difference:>+7.1%} {r.latency_share:>8.0%}"
                     + ("" if r.comparable else "  latency-bound" if not r.bandwidth_bound else "  pipelined chain"))
    e = sum(r.emulated_us for r in rows)
    s = sum(r.simulated_us for r in rows)
    lines.append(f"{'all':>3} {'':>4} {'':<14} {'':>12} {format_us(e):>12} {format_us(s):>13} "
                 f"{(s - e) / e if e else math.nan:>+7.1%}")
    return "\n".join(lines)


def format_calibration(cal: Calibration) -> str:
    lines = [f"goodput share {cal.goodput_share:.4f}, per transfer {cal.per_transfer_emu_s * 1e3:.2f} ms emulated, "
             f"per hop {cal.per_hop_emu_s * 1e3:.2f} ms emulated; "
             f"simulator {'cut-through' if cal.cut_through else 'store and forward'}",
             f"{'topology':<16} {'size B':>12} {'emulated':>12} {'fitted':>10} {'diff':>7}"]
    for s in cal.samples:
        p = cal.predict_us(s)
        lines.append(f"{s.topology:<16} {s.size_bytes:>12} {format_us(s.emulated_us):>12} {format_us(p):>10} "
                     f"{(p - s.emulated_us) / s.emulated_us:>+7.1%}")
    return "\n".join(lines)


def crosscheck_doc(fabric: str, routing: str, dilation: float, rows: Sequence[Any]) -> dict[str, Any]:
    """One fabric's crosscheck as `crosscheck.json` keeps it: each collective's figures and verdicts."""
    return {"topology": fabric, "routing": routing, "dilation": dilation,
            "collectives": [dataclasses.asdict(r) | {"difference": r.difference, "bandwidth_bound": r.bandwidth_bound,
                                                     "comparable": r.comparable} for r in rows]}
