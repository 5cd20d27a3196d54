"""A `fabriclab compare` run's rows as the markdown table of benchmarks/RESULTS.md, with the cause per row (no root).

    .venv/bin/python benchmarks/compare_markdown.py results/compare/compare.json [--sensitivity]

Reads `compare.json` (what `fabriclab compare` wrote) and prints, per row: fabric and routing, variant, GPUs,
mean and p99 step, utilisation, MFU, exposed communication (whole, and by process group), busbw of the
pipeline and data-parallel groups, the hottest link by tier, ECMP collisions by switch role, idle share,
scaling efficiency and the row's wall time; then the seed check's lines. `--sensitivity`: the sweep's points
(both steps, the speedup, the communication shares) and the vendor figures' verdicts, from the same file.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def pct(v: float) -> str:
    return f"{v * 100:.1f}%" if v == v else "-"  # NaN (a trace's MFU): no figure


def rows_table(rows: list[dict[str, Any]]) -> list[str]:
    out = ["| fabric (routing) | variant | GPUs | step | p99 | util | MFU | exposed comm | exposed by group | "
           "busbw PP / DP | hottest link by tier | ECMP collisions | idle | eff | row wall |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        by_group = ", ".join(f"{k} {pct(v)}" for k, v in sorted(r["exposed_by_group"].items(), key=lambda kv: -kv[1])
                             if v >= 0.0005)
        bus = r["busbw_by_group"]
        hot = ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(r["hottest_by_tier"].items())
                        if not k.endswith("->host"))
        coll = ", ".join(f"{k} {v}" for k, v in sorted(r["collisions_by_tier"].items())) or "0"
        out.append(f"| {r['fabric']} ({r['routing']}) | {r['variant'] or '-'} | {r['gpus']} | "
                   f"{r['step_mean_us'] / 1e6:.3f} s | {r['step_p99_us'] / 1e6:.3f} s | {pct(r['utilisation'])} | "
                   f"{pct(r['mfu'])} | {pct(r['comm_share'])} | {by_group or '-'} | "
                   f"{bus.get('pp', 0) / 1e9:.0f} / {bus.get('dp', 0) / 1e9:.0f} Gbit/s | {hot or '-'} | {coll} | "
                   f"{pct(r['idle_share'])} | {r['efficiency']:.3f} | "
                   + (f"{r['sim_wall_s']:.0f} s |" if "sim_wall_s" in r else "- |"))
    return out


def seed_lines(seed: list[dict[str, Any]]) -> list[str]:
    out = []
    for s in seed:
        verdict = ("reproduced in direction and size" if s["size_reproduced"] else
                   "reproduced in direction, not in size" if s["direction_reproduced"] else "not reproduced")
        out.append(f"- {s['metric']} ({s['variant'] or 'base'} rows, {s['gpus']} GPUs): vendor "
                   f"{s['seed_pyramid']:.4g} / {s['seed_dual_plane']:.4g}, ours {s['ours_pyramid']:.4g} / "
                   f"{s['ours_dual_plane']:.4g}: {verdict}" + (f" ({s['differs']})" if s["differs"] else ""))
    return out


def sensitivity_lines(sens: dict[str, Any]) -> list[str]:
    out = ["| point | pyramid / dual-plane step | speedup | comm pyramid / dual-plane | pyramid's hottest link by tier | "
           "rows run (wall) |", "|---|---|---|---|---|---|"]
    for p in sens.get("points", []):
        hot = ", ".join(f"{k} {v * 100:.0f}%" for k, v in sorted(p["pyramid_hottest"].items())
                        if not k.endswith("->host"))
        walls = ", ".join(f"{k} {v:.0f} s" for k, v in p["wall_s"].items()) or "cached"
        out.append(f"| {p['point']} | {p['pyramid_step_us'] / 1e6:.3f} / {p['dual_plane_step_us'] / 1e6:.3f} s | "
                   f"{p['speedup']:.3f}x | {pct(p['pyramid_comm_share'])} / {pct(p['dual_plane_comm_share'])} | "
                   f"{hot or '-'} | {walls} |")
    out.append("")
    for v in sens.get("verdicts", []):
        out.append(f"- {v['metric']}: vendor {v['seed_ratio']:.3g}x, ours {v['ours_ratio']:.3g}x: {v['verdict']}")
    for key in ("arithmetic", "anchors"):
        out.extend(f"- {line}" for line in sens.get(key, []))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("compare_json", type=Path)
    ap.add_argument("--sensitivity", action="store_true")
    args = ap.parse_args(argv)
    doc = json.loads(args.compare_json.read_text())
    meta = doc["meta"]
    sim = meta.get("sim", {})
    res = f"{sim['resolution_s'] * 1e6:g} us" if "resolution_s" in sim else "?"
    wall = f"{meta['wall_s'] / 60:.1f} min" if "wall_s" in meta else "?"
    print(f"trace {meta.get('trace', '?')}; {len(doc['rows'])} rows of {meta.get('rows_expected', '?')}; "
          f"resolution {res}; wall {wall}")
    print()
    print("\n".join(rows_table(doc["rows"])))
    print()
    print("\n".join(seed_lines(doc.get("seed", []))))
    if args.sensitivity and "sensitivity" in doc:
        print()
        print("\n".join(sensitivity_lines(doc["sensitivity"])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
