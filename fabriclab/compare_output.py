"""compare's outputs: the table as text (with each row's cause and the model it ran), the rows that failed, and
compare.json, .csv, .txt, .png and .html (`write`; the pictures drawn by `fabriclab.render`)."""
from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fabric.flowsim import SimOptions
from fabriclab.rows import Row

COLUMNS = (("fabric", "fabric"), ("routing", "routing"), ("gpus", "GPUs"), ("algorithm", "all-reduce"),
           ("utilisation", "util"),
           ("comm_share", "comm"), ("step_mean_us", "step mean"), ("step_p99_us", "step p99"),
           ("busbw_bps", "busbw"), ("efficiency", "eff"), ("hot_link_share", "hot links"),
           ("load_max_over_mean", "max/mean load"), ("ecmp_collisions", "ECMP coll."), ("cached", "cached"))


def _cell(key: str, v: Any) -> str:
    from traffic.formatting import format_bps, format_share, format_us

    if key in ("utilisation", "comm_share", "hot_link_share", "mfu", "idle_share"):
        return format_share(v)
    if key.endswith("_us"):
        return format_us(v)
    if key == "busbw_bps":
        return format_bps(v)
    if key in ("efficiency", "load_max_over_mean"):
        return f"{v:.3f}"
    if key == "cached":
        return "yes" if v else ""
    return str(v)


def latency_note(spec: dict[str, Any]) -> str:
    """The latency a row was simulated with (its resolved run, `Row.spec`), in words."""
    res = (f"; events within {spec['resolution_us']:.3g} us taken together (--resolution-us)"
           if spec["resolution_us"] * 1e-6 > SimOptions().resolution_s else "")
    nvlink = spec.get("nvlink_latency_us", 0.0)
    nvl = f"; {nvlink:.3g} us per in-server (NVLink) transfer" if nvlink > 0 else ""
    if spec["per_transfer_us"] <= 0 and spec["per_hop_us"] <= 0:
        return "latency: none on the network (bandwidth only: --per-transfer-us 0 --per-hop-us 0)" + nvl + res
    return (f"latency: {spec['per_transfer_us']:.3g} us per transfer and {spec['per_hop_us']:.3g} us per link of its "
            "path (defaults: NCCL's per-network-step ring latency over a leaf-spine path, a 51.2T-class switch; "
            "docs/simulator.md)" + nvl + res)


def _models(rows: Sequence[Row]) -> list[str]:
    """The resolved runs behind the rows: one line per distinct model, with the sizes that ran it."""
    from fabriclab.study.spec import format_spec

    sizes: dict[str, list[int]] = {}
    docs: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.spec:
            doc = {k: v for k, v in r.spec.items() if k not in ("workload", "topology", "routing", "ranks", "gpus")}
            key = json.dumps(doc, sort_keys=True, default=str)
            docs[key] = doc
            sizes.setdefault(key, []).append(r.gpus)
    return [format_spec(docs[k], f"model at {', '.join(map(str, sorted(set(n))))} GPUs:") for k, n in sizes.items()]


def format_table(rows: Sequence[Row], seed: Sequence[dict[str, Any]] = ()) -> str:
    from traffic.formatting import format_bps, format_share

    def cell(r: Row, k: str) -> str:
        return _cell(k, getattr(r, k)) + (" lockstep" if k == "algorithm" and r.lockstep else "")

    cols = list(COLUMNS)
    if any(r.variant for r in rows):
        cols.insert(3, ("variant", "variant"))
    if any(math.isfinite(r.mfu) for r in rows):
        cols.insert(cols.index(("utilisation", "util")) + 1, ("mfu", "MFU"))
    left = cols.index(("algorithm", "all-reduce"))
    table = [[h for _, h in cols]] + [[cell(r, k) for k, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) if i > left else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in table]
    lines.append("")
    causes = [r for r in rows if r.exposed_by_group or r.hottest_by_tier]
    if causes:
        lines.append("the cause, per row: exposed communication by process group (of the step), busbw by group, "
                     "the hottest link's peak utilisation by tier, ECMP collisions by switch role, waits (idle):")
        for r in causes:
            exposed = ", ".join(f"{k} {format_share(v)}" for k, v in sorted(r.exposed_by_group.items(),
                                                                             key=lambda kv: -kv[1]) if v > 0)
            bus = ", ".join(f"{k} {format_bps(v)}" for k, v in sorted(r.busbw_by_group.items()))
            hot = ", ".join(f"{k} {format_share(v)}" for k, v in sorted(r.hottest_by_tier.items()))
            coll = ", ".join(f"{k} {v}" for k, v in sorted(r.collisions_by_tier.items())) or "none"
            lines.append(f"  {r.fabric} {r.routing} {r.gpus}{' ' + r.variant if r.variant else ''}: exposed "
                         f"{exposed or 'none'}; busbw {bus or '-'}; hottest {hot or '-'}; collisions {coll}; "
                         f"idle {format_share(r.idle_share)}")
        lines.append("")
    if any(r.lockstep for r in rows):
        lines.append("lockstep: each step of a collective waited for all of the step before (the simulator's "
                     "approximation at scale; a ring runs at its slowest hop's pace either way)")
    specs = [r.spec for r in rows if r.spec]
    if specs:
        lines.append(latency_note(specs[0]))
        lines.extend(_models(rows))
    lines.append("scaling efficiency: 1 / mean step at N over the same at the series' smallest size (fixed batch "
                 "per GPU); hot links: share of busy fabric link-intervals above 90%; ECMP collisions: connections "
                 "sharing a port while an equal-cost port of the same switch carries none")
    if seed:
        lines.append("")
        lines.append(f"seed figures (vendor article, 1024 GPUs) against ours at {seed[0]['gpus']} GPUs, "
                     "pyramid / dual-plane:")
        for s in seed:
            m = s["metric"]
            verdict = ("reproduced in direction and size" if s["size_reproduced"] else
                       "reproduced in direction, not in size" if s["direction_reproduced"] else "not reproduced")
            lines.append(f"  {m:<13} seed {_cell(m, s['seed_pyramid'])} / {_cell(m, s['seed_dual_plane'])}; ours "
                         f"{_cell(m, s['ours_pyramid'])} / {_cell(m, s['ours_dual_plane'])}: {verdict}"
                         + (f" ({s['differs']})" if s["differs"] else ""))
    return "\n".join(lines)


def format_failed(failed: Sequence[dict[str, str]]) -> str:
    """The rows that failed (`RowsFailed.failed`), one line each."""
    return "\n".join([f"failed rows ({len(failed)}; every other row finished):"]
                     + [f"  {f['row']}: {f['kind']}: {f['error']}" for f in failed])


def write(rows: Sequence[Row], seed: Sequence[dict[str, Any]], out_dir: Path, meta: dict[str, Any],
          sensitivity: dict[str, Any] | None = None, sensitivity_text: str = "", pictures: bool = True) -> list[Path]:
    """compare.json, .csv, .txt, .png and .html (the last two drawn by `fabriclab.render`) in `out_dir`;
    `sensitivity`: the sweep's section (`fabriclab.sensitivity.analyse`, its rows in `sensitivity["rows"]`) and
    its text (`format_section`); the rows that failed (`meta["failed"]`) listed in the text too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "compare.json", out_dir / "compare.csv", out_dir / "compare.txt"]
    doc = {"meta": meta, "rows": [dataclasses.asdict(r) for r in rows], "seed": list(seed)}
    if sensitivity is not None:
        doc["sensitivity"] = sensitivity
    paths[0].write_text(json.dumps(doc, indent=2, default=str))
    with paths[1].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fld.name for fld in dataclasses.fields(Row)])
        w.writeheader()
        for r in rows:
            w.writerow(dataclasses.asdict(r))
    text = (format_table(rows, seed) + (f"\n\n{sensitivity_text}" if sensitivity_text else "")
            + (f"\n\n{format_failed(meta['failed'])}" if meta.get("failed") else ""))
    paths[2].write_text(text + "\n")
    if not pictures:  # a partial write as rows finish: the pictures cost ~1 s, drawn once at the end
        return paths
    from fabriclab import render  # compare.png and compare.html: the rows drawn (`fabriclab.render`)

    title = f"fabriclab compare: {meta.get('trace', '')}"
    png = render.compare_png(rows, title)
    paths += [out_dir / "compare.png", out_dir / "compare.html"]
    paths[3].write_bytes(png)
    paths[4].write_text(render.compare_html(rows, title, meta, png), encoding="utf-8")
    return paths
