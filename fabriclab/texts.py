"""The text `topo show`, `trace show` and `workload llm` print: topology summaries side by side, a workload's
steps per rank and per process group. Formatting only; the figures come from `fabric.analysis` and
`traffic.traces`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fabric.analysis import TopoSummary
from traffic.formatting import format_bytes, format_us
from traffic.workload import LEFT_OUT_STREAM

#: `trace show` lists a job rank by rank up to this many ranks, else one rank per process group
TRACE_SHOW_RANKS = 16


def _fmt(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items()) or "-"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


_LABELS = {
    "name": "name",
    "planes": "planes",
    "hosts": "hosts",
    "switches": "switches",
    "switches_by_role": "  by role",
    "links": "links",
    "nic_ports_per_host": "NIC ports per host",
    "host_bandwidth_gbps": "per-host bandwidth (Gbit/s)",
    "total_host_bandwidth_gbps": "total host bandwidth (Gbit/s)",
    "bisection_bandwidth_gbps": "bisection bandwidth (Gbit/s)",
    "bisection_ratio": "bisection / half the hosts' bandwidth",
    "oversubscription": "oversubscription (down:up, worst per tier)",
    "hops_min": "hops between hosts, min",
    "hops_max": "hops between hosts, max",
    "ecmp_paths_min": "equal-cost paths between hosts, min",
    "ecmp_paths_max": "equal-cost paths between hosts, max",
}


#: shown after "hosts" when a fabric has servers of more than one GPU
_SERVER_LABELS = {
    "servers": "servers",
    "gpus_per_server": "GPUs per server",
    "rails": "rails",
    "nvlink_gbps": "NVLink per GPU, each way (Gbit/s)",
}


def _labels(dicts: list[dict[str, Any]]) -> dict[str, str]:
    if all(d["gpus_per_server"] == 1 for d in dicts):
        return _LABELS
    out: dict[str, str] = {}
    for key, label in _LABELS.items():
        out[key] = label
        if key == "hosts":
            out.update(_SERVER_LABELS)
    return out


def _show_value(d: dict[str, Any], key: str) -> str:
    if key == "rails" and not d[key]:
        return "no rail wiring"
    return _fmt(d[key])


def format_topologies(summaries: list[TopoSummary], as_json: bool) -> str:
    """`topo show`: one fabric's figures, or several side by side with what differs marked (or JSON)."""
    dicts = [s.to_dict() for s in summaries]
    if as_json:
        return json.dumps(dicts[0] if len(dicts) == 1 else dicts, indent=2)
    labels = _labels(dicts)
    width = max(len(v) for v in labels.values()) + 2
    lines = []
    for key, label in labels.items():
        values = [_show_value(d, key) for d in dicts]
        mark = "  *" if len(values) > 1 and len(set(values)) > 1 and key != "name" else ""
        lines.append(f"{label:<{width}}" + "".join(f"{v:<28}" for v in values).rstrip() + mark)
    if len(dicts) > 1:
        lines.append("(* marks what differs)")
    return "\n".join(lines)



def format_workload(workload: Any, rank_asked: int | None, as_json: bool, extra: dict[str, Any] | None = None
                    ) -> str:
    """`trace show` and `workload llm`: a workload's steps per rank (a large job per process group, as
    `rank_asked` or its first rank sees it), or JSON with `extra` merged in."""
    from traffic.traces import summarize as summarize_trace
    from traffic.traces.groups import by_group

    summary = summarize_trace(workload)
    # a large job is shown as one rank sees it, per process group; a small one rank by rank
    per_group = rank_asked is not None or len(workload.ranks) > TRACE_SHOW_RANKS
    rank = rank_asked if rank_asked is not None else workload.ranks[0].rank
    groups = by_group(workload, rank) if per_group else []
    if as_json:
        out = summary.to_dict()
        if per_group:
            out["per_step"] = [s for s in out["per_step"] if s["rank"] == rank]
            out["by_group"] = {"rank": rank, "rows": [g.to_dict() for g in groups]}
        out.update(extra or {})
        return json.dumps(out, indent=2)
    lines = [f"trace        {summary.source} ({summary.format})",
             f"ranks        {len(summary.ranks)} in the trace of a {summary.world_size}-rank job; "
             f"{summary.steps} step(s) per rank; {'timed' if summary.timed else 'NO timings'}"]
    training = getattr(workload, "training", None)
    if training is not None:
        lines.append(f"model        {training.summary()}")
    rows = [st for st in summary.step_summaries if not per_group or st.rank == rank]
    lines.append(f"{'rank':>5} {'step':>6} {'duration':>11} {'compute':>11} {'exposed comm':>13} {'share':>7}  collectives")
    for st in rows:
        share = "-" if st.exposed_comm_share is None else f"{st.exposed_comm_share:.1%}"
        kinds = ", ".join(f"{k.count} {k.kind} {format_bytes(k.size_bytes)}" for k in st.kinds)
        if st.left_out_us:
            kinds += f"; of the exposed, {format_us(st.left_out_us)} {LEFT_OUT_STREAM}"
        if st.warmup:
            kinds = "warm-up; " + kinds
        lines.append(f"{st.rank:>5} {st.number:>6} {format_us(st.duration_us):>11} {format_us(st.compute_us):>11} "
                     f"{format_us(st.exposed_comm_us):>13} {share:>7}  {kinds}")
    if per_group:
        lines.append(f"\nrank {rank}'s collectives per step and group (stream)")
        lines.append(f"{'step':>6} {'group':>6} {'kind':<15} {'ranks':>5} {'count':>7} {'each':>19} {'total':>11}")
        for g in groups:
            each = (format_bytes(g.min_bytes) if g.min_bytes == g.max_bytes
                    else f"{format_bytes(g.min_bytes)}-{format_bytes(g.max_bytes)}")
            lines.append(f"{g.step:>6} {g.group:>6} {g.kind:<15} {g.group_size:>5} {g.count:>7} {each:>19} "
                         f"{format_bytes(g.total_bytes):>11}")
    for note in summary.notes:
        lines.append(f"note         {note}")
    return "\n".join(lines)


def format_runs(results: list[tuple[Path, Any]], check: dict[str, Any] | None, out: Path, as_json: bool) -> str:
    """`replay` and `sim`: one run's summary, or two side by side (with the main job's check and verdict at
    scale, where it ran), each with its resolved model; or JSON."""
    from fabriclab.study import main_job
    from fabriclab.study.spec import format_spec
    from traffic import report

    if as_json:
        return json.dumps({"runs": [{"dir": str(d), "summary": report.summarize(r).to_dict(), "spec": r.meta.spec}
                                    for d, r in results],
                           "comparison": report.compare(results[0][1], results[1][1]).to_dict()
                           if len(results) == 2 else None, **({"simulated": check} if check else {})}, indent=2)
    if len(results) != 2:
        d, r = results[0]
        lines = [report.format_summary(report.summarize(r))]
        lines += [format_spec(r.meta.spec)] if r.meta.spec else []
        return "\n".join(lines + [f"report       {d / 'report.html'}"])
    lines = [report.format_comparison(report.compare(results[0][1], results[1][1]))]
    lines += [format_spec(r.meta.spec, f"model of {r.meta.topology}") for _, r in results if r.meta.spec]
    if check:
        lines.append(main_job.format_check(check))
        if "at_scale" in check:
            lines.append(main_job.format_at_scale(check["at_scale"]))
    lines.append(f"reports      {out / 'comparison.html'}, {results[0][0] / 'report.html'}, "
                 f"{results[1][0] / 'report.html'}")
    return "\n".join(lines)
