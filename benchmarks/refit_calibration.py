"""Refit a recorded calibration with the cut-through simulator and recompute the cross-check (no root).

    .venv/bin/python benchmarks/refit_calibration.py CALIBRATION_JSON FIGURES_JSONL [--traces DIR]

Inputs, both written by a run of `tests/emulation/test_calibration.py` (in CI: the pytest temporary
folder's `calibration.json`, and `results/test-figures.jsonl`):
- the calibration file: the emulated microbenchmarks (ring all-reduces on dual-plane-16 and
  pyramid-16) and the parameters fitted to them;
- the figures: the cross-check's differences (simulated - emulated) / emulated per collective of
  ResNet-50's first step and DLRM's two largest all-to-alls on both fabrics, from which the emulated
  times are recovered (emulated = simulated / (1 + difference), the simulated times recomputed here
  with the recorded calibration; the differences are rounded to 0.1%), or, where the record has them,
  the emulated times themselves.
It refits the microbenchmarks with the features of the simulator in each forwarding mode (store and
forward, cut-through: `SimOptions.cut_through`) and prints, per trace and fabric, the difference of
the calibrated simulator in each mode from the emulated times. It never runs the emulator: it
answers "what would the cross-check of that run have said with the other simulator".
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRACE_RUNS = {  # name -> (fabric, routing, ports), as test_calibration runs them
    "dual-plane-16": ("adaptive", "planned"),
    "pyramid-16": ("ecmp", "hashed"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("calibration", help="calibration.json written by the test")
    ap.add_argument("figures", help="test-figures.jsonl with the test's sim_vs_emulation record")
    args = ap.parse_args()

    from fabric import topofile
    from fabric.flowsim import SimOptions
    from fabriclab import calibrate as cal
    from tests.emulation.test_replay import DLRM, DLRM_REPEAT, RESNET, at_dilation, first_steps, large_all_to_alls
    from traffic.replay import ReplayOptions, plan_replay
    from fabriclab.backends import Simulated, run_workload
    from traffic.traces import load

    recorded = cal.Calibration.read(args.calibration)
    records = [json.loads(line) for line in Path(args.figures).read_text().splitlines() if line.strip()]
    cross = [r for r in records if r.get("test") == "sim_vs_emulation"]
    if not cross:
        sys.exit(f"{args.figures}: no sim_vs_emulation record")
    diffs = cross[-1]["difference"]
    emulated_rec = cross[-1].get("emulated_us", {})
    fabrics = {name: topofile.load(name) for name in TRACE_RUNS}

    fits = {}
    for mode in (False, True):
        samples = []
        for topo in TRACE_RUNS:
            mine = [s for s in recorded.samples if s.topology == topo]
            if not mine:
                continue
            w = cal.micro_workload(len(fabrics[topo].hosts), [s.size_bytes for s in mine])
            opts = ReplayOptions(ranks=len(fabrics[topo].hosts), dilation=mine[0].dilation, ports="planned",
                                 algorithm="ring")
            for s, (t0, s_feat, h_feat) in zip(mine, cal.features(w, fabrics[topo], mine[0].routing, opts, mode)):
                samples.append(dataclasses.replace(s, t0_us=t0, transfers_on_path=s_feat, hops_on_path=h_feat))
        fits[mode] = cal.fit(samples, cut_through=mode)
        f = fits[mode]
        errs = [(f.predict_us(s) - s.emulated_us) / s.emulated_us for s in samples]
        print(f"{'cut-through' if mode else 'store and forward':<18} g {f.goodput_share:.4f}, "
              f"a {f.per_transfer_emu_s * 1e3:.2f} ms, h {f.per_hop_emu_s * 1e3:.3f} ms emulated; "
              f"microbenchmarks {min(errs):+.1%} to {max(errs):+.1%} of the fit")

    for name, w, dilation_x, repeat in (("resnet50", first_steps(load(RESNET), 1), 1, 1),
                                        ("dlrm", large_all_to_alls(load(DLRM), 20_000), 4, DLRM_REPEAT)):
        for topo, (routing, ports) in TRACE_RUNS.items():
            key = f"{name}_{topo}"
            if key not in diffs:
                continue
            fab = fabrics[topo]
            opts = at_dilation(w, dilation_x, ports=ports, repeat=repeat)
            dilation = plan_replay(w, fab, opts).dilation

            runs = {}
            for which, c in (("recorded", recorded), ("saf", fits[False]), ("ct", fits[True])):
                res = run_workload(w, name, fab, routing, opts,
                                   Simulated(c.sim_options(dilation, SimOptions(poll_s=0.0)))).result
                runs[which] = [(x.kind, x.size_bytes, x.duration_real_us)
                               for x in sorted(res.collectives, key=lambda x: x.index)]
            if key in emulated_rec:
                emulated = emulated_rec[key]
            else:
                emulated = [t / (1 + d) for (_, _, t), d in zip(runs["recorded"], diffs[key])]
            print(f"\n{name} on {topo} ({routing}, {ports} ports), dilation {dilation:.4g}")
            print(f"{'kind':<12} {'size B':>10} {'emulated us':>12} {'s&f':>8} {'cut-through':>12}")
            rows = zip(emulated, runs["saf"], runs["ct"])
            for e, (kind, size, saf), (_, _, ct) in rows:
                print(f"{kind:<12} {size:>10} {e:>12.2f} {(saf - e) / e:>+8.1%} {(ct - e) / e:>+12.1%}")
            total_e = sum(emulated)
            total_saf, total_ct = (sum(t for _, _, t in runs[k]) for k in ("saf", "ct"))
            print(f"{'total':<12} {'':>10} {total_e:>12.2f} {(total_saf - total_e) / total_e:>+8.1%} "
                  f"{(total_ct - total_e) / total_e:>+12.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
