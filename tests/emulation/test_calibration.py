"""The simulator calibrated on the emulator's microbenchmarks agrees with the emulator on real traces.

The calibration (`fabriclab.calibrate`) sees only ring all-reduces of three sizes on idle dual-plane-16
and pyramid-16; the traces it is then checked on (ResNet-50's first step: five all-reduces of 8-31 MB
and two broadcasts; DLRM's two largest all-to-alls) it never sees. Both run on the emulator (real TCP
bytes through the switches) and on the simulator with the fitted parameters at the emulated run's
dilation, cut-through as the replay's agents forward (`fabriclab.calibrate.CUT_THROUGH`). Every
comparable collective (`CrossRow.comparable`: the calibrated delays at most a quarter of its simulated
time, and not a pipelined chain: all but ResNet's two broadcasts, latency-bound chains of chunks) and
each trace's total must agree within 15% (AGREEMENT), on both fabrics; a collective repeated is
compared at its fastest emulated occurrence, in the total too, as the calibration fits its
microbenchmarks to their fastest run: the userspace datapath's stalls and a CPU shared with another
process only ever add emulated time (docs/emulation.md; with a busy core DLRM's first two all-to-alls on
dual-plane-16 were once 20% slower than the last two, and their median 16.4% off the simulator). Each fabric runs with what it
is built for: the dual-plane's adaptive routing with planned source ports, the pyramid's ECMP with
hashed ones.
"""
from __future__ import annotations

import statistics

import pytest

from fabric import topofile
from fabriclab import calibrate as cal
from tests.conftest import replayed
from tests.emulation.shared_runs import emulated
from tests.emulation.test_replay import DLRM_REPEAT, DP16, at_dilation, first_steps, large_all_to_alls
from tests.real_traces import DLRM, RESNET, needs
from traffic.traces import load

pytestmark = pytest.mark.emulation
PY16 = topofile.load("pyramid-16")
#: the agreement asked of the calibrated simulator, per collective (the median of its occurrences) and
#: per trace total, by (trace, fabric): the issue's 15%. (None would report a pair without asserting it.)
#: DLRM's pairwise all-to-all on pyramid-16 was the reason for cut-through: store and forward ran its
#: 15 rounds one after another, +34% to +41% over the emulator, which overlaps them
AGREEMENT: dict[tuple[str, str], float | None] = {
    ("resnet50", "dual-plane-16"): 0.15, ("resnet50", "pyramid-16"): 0.15,
    ("dlrm", "dual-plane-16"): 0.15, ("dlrm", "pyramid-16"): 0.15}
#: every microbenchmark within this of the fit (measured: 0.7-3.7% idle; one busy run, before the
#: replay agent's minimum slice, 15%: the agents' reaction time grows when the CPU is shared)
FIT_BOUND = 0.15


def run_emulated(w, fab, routing, opts):
    return replayed(w, w.source, fab, routing, opts)


@needs(RESNET, DLRM)
def test_the_calibrated_simulator_agrees_with_the_emulator_on_two_real_traces(tmp_path):
    c = cal.calibrate([(DP16, "adaptive"), (PY16, "adaptive")], run_emulated, log=print)
    c.write(tmp_path / "calibration.json")
    from tests.emulation.test_multipath import FIGURES
    c.write(FIGURES.parent / "test-calibration.json")  # beside the figures (benchmarks/refit_calibration.py)
    print(cal.format_calibration(c))
    fit_err = [abs(c.predict_us(s) - s.emulated_us) / s.emulated_us for s in c.samples]
    assert 0.6 < c.goodput_share <= 1.0
    assert max(fit_err) <= FIT_BOUND, fit_err

    resnet = first_steps(load(RESNET), 1)
    dlrm = large_all_to_alls(load(DLRM), 20_000)
    figures = {}
    emulated_us: dict[str, list[float]] = {}  # recorded too: benchmarks/refit_calibration.py reads them
    worst = []
    # DLRM's all-to-alls at 4x the default dilation (as in test_replay: long against per-hop latency),
    # repeated: the median of the four occurrences is compared
    # the emulated runs are test_replay's (tests/emulation/shared_runs.py: emulated once per session)
    for name, w, dilation_x, repeat in (("resnet50", resnet, 1, 1), ("dlrm", dlrm, 4, DLRM_REPEAT)):
        def run_shared(w, fab, routing, opts, name=name):
            return emulated(name, w, w.source, fab, routing, opts)

        for fab, routing, ports in ((DP16, "adaptive", "planned"), (PY16, "ecmp", "hashed")):
            opts = at_dilation(w, dilation_x, ports=ports, repeat=repeat)
            rows, _, _ = cal.crosscheck(w, name, fab, routing, opts, c, run_shared)
            print(f"{name} on {fab.name} ({routing}), dilation {opts.dilation:.4g}\n{cal.format_rows(rows)}")
            figures[f"{name}_{fab.name}"] = [round(r.difference, 3) for r in rows]
            emulated_us[f"{name}_{fab.name}"] = [round(r.emulated_us, 4) for r in rows]
            # every comparable collective (kind and size; its fastest emulated occurrence against the
            # simulator's, alike for every occurrence: DLRM's all-to-all runs DLRM_REPEAT times), and
            # the trace's communication time as a whole
            groups: dict[tuple[str, int], list[cal.CrossRow]] = {}
            for r in rows:
                groups.setdefault((r.kind, r.size_bytes), []).append(r)
            by_collective = {k: comparable for k, occ in groups.items()
                             if (comparable := [r for r in occ if r.comparable])}
            assert by_collective
            bound = AGREEMENT[(name, fab.name)]
            if bound is None:
                continue
            for (kind, size), occ in by_collective.items():
                e = min(r.emulated_us for r in occ)
                s = statistics.median(r.simulated_us for r in occ)
                worst.append((abs(s - e) / e - bound, abs(s - e) / e, name, fab.name, kind, size))
            # the total: each collective (kind and size) at its fastest occurrence times its count, so
            # one occurrence stretched by a stall of the userspace datapath (tens of ms, docs/emulation.md;
            # a DLRM all-to-all is ~50 ms emulated: seen once at 0.80 us against 0.53-0.59) weighs
            # no more in the total than in the collective's own comparison
            e = sum(min(r.emulated_us for r in occ) * len(occ) for occ in groups.values())
            s = sum(statistics.median(r.simulated_us for r in occ) * len(occ) for occ in groups.values())
            worst.append((abs(s - e) / e - bound, abs(s - e) / e, name, fab.name, "all", 0))
    from tests.emulation.test_multipath import record_figures
    record_figures("sim_vs_emulation", calibration={"goodput_share": round(c.goodput_share, 4),
                                                    "per_transfer_emu_ms": round(c.per_transfer_emu_s * 1e3, 2),
                                                    "per_hop_emu_ms": round(c.per_hop_emu_s * 1e3, 2)},
                   difference=figures, emulated_us=emulated_us)
    assert max(worst)[0] <= 0, sorted(worst)[-3:]
