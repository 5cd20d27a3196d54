"""The main job's verdicts (`scripts/lab run`, `fabriclab replay` with no TRACE), as library code.

- `MAIN_TRACE`, `MAIN_TOPOLOGIES`, `MAIN_DILATION`: what it runs (`apply_defaults` puts them on a command's
  arguments when no TRACE is given);
- `emulated_and_simulated`: the two fabrics' mean steps on the emulator and on the simulator, their ratios,
  and whether the two agree (`AGREEMENT_TOLERANCE`): a ratio of ratios further from 1 is flagged;
- `at_scale`: the whole preset at a cluster size on the simulator, as `fabriclab compare` runs it (the same
  rows, the same cache), and `at_scale_verdict`: the step ratio and the evidence for it, picked from the rows.
The commands only print what these return (`format_check`, `format_at_scale`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fabric.errors import FabriclabError
from fabric.latency import DEFAULT_RESOLUTION_US
from fabriclab.study.spec import SimModel

#: The main job (`fabriclab replay` and `sim` with no TRACE; `scripts/lab run`): a 16-GPU slice of the GPT-3 175B
#: step (the 175B layer shape, 8 of its 96 layers, TP4 in each of 4 servers, PP2 and DP2 across them, 4
#: micro-batches) on two server-wired 16-GPU fabrics, where every DP and PP byte leaves its server's edge switch:
#: through the pyramid's 2:1 ToR uplinks (ECMP), or the dual-plane's non-blocking leaves (adaptive)
MAIN_TRACE = ("llm:gpt3-175b,name=gpt3-175b-slice16,model.layers=8,parallel.tp=4,parallel.pp=2,parallel.dp=2,"
              "global_batch=8,gpus_per_server=4")
MAIN_TOPOLOGIES = ("dual-plane-16-servers", "pyramid-16-servers")
#: the main job's dilation on the emulator: its 50 MB pipeline transfers at two of the shaper's bursts and more
#: (at the automatic dilation, chosen for its GB-sized gradient buckets, they would leave faster than the links)
MAIN_DILATION = 122.0


def apply_defaults(args: Any) -> bool:
    """With no TRACE, the main job's: its trace, fabrics (unless given) and emulation dilation (unless
    given) put on `args`; True then. A TRACE named `builtin` is the built-in recording."""
    if args.trace:
        return False
    args.trace = MAIN_TRACE
    if not args.topology:
        if args.routing:
            raise FabriclabError("--routing needs --topology (one per topology)")
        args.topology, args.routing = list(MAIN_TOPOLOGIES), ["adaptive", "ecmp"]
    if getattr(args, "dilation", None) is None and hasattr(args, "dilation"):
        args.dilation = MAIN_DILATION
    return True


#: the main job at scale: the whole GPT-3 175B step on server-wired fabrics of the cluster's size
MAIN_SCALE_PRESET = "llm:gpt3-175b"
MAIN_SCALE_SERIES = (("pyramid-1024-servers", "ecmp"), ("dual-plane-1024-servers", "adaptive"))
#: the emulator's and the simulator's dual-plane / pyramid step ratios agree when their ratio is within this of 1
AGREEMENT_TOLERANCE = 0.20
#: the simulator's model of the main job's check: the default model at the exact resolution (the 16-GPU slice is small)
CHECK_MODEL = SimModel(resolution_us=DEFAULT_RESOLUTION_US)
#: the row fields the at-scale verdict keeps
AT_SCALE_FIELDS = ("fabric", "routing", "gpus", "step_mean_us", "comm_share", "utilisation", "exposed_by_group",
                   "busbw_by_group", "hottest_by_tier", "collisions_by_tier", "sim_wall_s", "cached", "spec")


def emulated_and_simulated(emulated: Sequence[Any], simulated: Sequence[Any]) -> dict[str, Any]:
    """The two fabrics' mean steps (`traffic.results.RunResult`s a, b) on the emulator and the simulator, their
    ratios (b / a), the ratio of ratios and whether it is within `AGREEMENT_TOLERANCE` of 1."""
    from traffic import report

    def steps(rs: Sequence[Any]) -> list[float]:
        out = []
        for r in rs:
            p = report.summarize(r).step_time_us
            if p is None:
                raise FabriclabError(f"{r.meta.topology}: the run has no steps")
            out.append(p.mean)
        return out

    emu, sim = steps(emulated), steps(simulated)
    agreement = (emu[1] / emu[0]) / (sim[1] / sim[0])
    return {"fabrics": [r.meta.topology for r in emulated], "emulated_step_us": emu, "simulated_step_us": sim,
            "emulated_ratio": emu[1] / emu[0], "simulated_ratio": sim[1] / sim[0], "agreement": agreement,
            "agrees": abs(agreement - 1) <= AGREEMENT_TOLERANCE}


def format_check(c: dict[str, Any]) -> str:
    from traffic.formatting import format_us

    a, b = c["fabrics"]
    flag = "" if c.get("agrees", True) else (f"; they DISAGREE by more than {AGREEMENT_TOLERANCE:.0%}: the emulator "
                                             "or the simulator is off for this plan")
    return (f"simulated    the same plan on the flow-level simulator: {b} / {a} step "
            f"{format_us(c['simulated_step_us'][1])} / {format_us(c['simulated_step_us'][0])} = "
            f"{c['simulated_ratio']:.3f}x (emulated {c['emulated_ratio']:.3f}x; ratio of ratios "
            f"{c['agreement']:.3f}{flag})")


def at_scale_verdict(pyramid: dict[str, Any], dual: dict[str, Any], gpus: int, preset: str) -> dict[str, Any]:
    """The verdict from the two rows (compare's `Row` fields as dicts): the step ratio, and the evidence behind
    it: which group's traffic the pyramid exposes more of, its busbw on each, and the hottest tier of each."""
    def hottest(row: dict[str, Any]) -> tuple[str, float]:
        return max(row["hottest_by_tier"].items(), key=lambda kv: kv[1], default=("-", 0.0))

    groups = sorted(set(pyramid["exposed_by_group"]) | set(dual["exposed_by_group"]))
    gap = {g: pyramid["exposed_by_group"].get(g, 0.0) - dual["exposed_by_group"].get(g, 0.0) for g in groups}
    worst = max(gap, key=lambda g: gap[g]) if gap else None
    return {"preset": preset, "gpus": gpus, "rows": [pyramid, dual],
            "step_ratio": pyramid["step_mean_us"] / dual["step_mean_us"],
            "cause_group": worst, "exposed_gap": gap, "hottest": [hottest(pyramid), hottest(dual)]}


#: the least share of the step the verdict names a group for: what `format_share` prints as 0.1 % after rounding
SHOWN_SHARE = 0.0005


def format_at_scale(c: dict[str, Any]) -> str:
    """The at-scale verdict as the main job prints it: the step ratio, then its cause from the rows."""
    from traffic.formatting import format_bps, format_share, format_us

    p, d = c["rows"]

    def group(key: str, g: str, fmt: Callable[[float], str]) -> str:
        return f"{fmt(p[key].get(g, 0.0))} / {fmt(d[key].get(g, 0.0))}"

    (tier_p, hot_p), (tier_d, hot_d) = c["hottest"]
    g = c["cause_group"]
    # the other groups, those with a share to show (an empty group, e.g. "emb" at 0.0 % on both, says nothing)
    others = [x for x in sorted(c["exposed_gap"]) if x != g
              and max(p["exposed_by_group"].get(x, 0.0), d["exposed_by_group"].get(x, 0.0)) >= SHOWN_SHARE]
    cause = (f"{g} busbw {group('busbw_by_group', g, format_bps)}, exposed {g} "
             f"{group('exposed_by_group', g, format_share)}" if g else "no exposed communication")
    rest = "".join(f" and {x} {group('exposed_by_group', x, format_share)}" for x in others)
    return (f"at {c['gpus']} GPUs the whole {c['preset'][4:]} step on the simulator: {p['fabric']} / {d['fabric']} "
            f"{format_us(p['step_mean_us'])} / {format_us(d['step_mean_us'])} = {c['step_ratio']:.3f}x\n"
            f"  why        {cause}{rest} of the step, communication {format_share(p['comm_share'])} / "
            f"{format_share(d['comm_share'])}; hottest link {tier_p} {format_share(hot_p)} / {tier_d} "
            f"{format_share(hot_d)}")


def at_scale(gpus: int, cache_dir: Path | None, run_rows: Callable[..., list[Any]] | None = None,
             preset: str = MAIN_SCALE_PRESET) -> dict[str, Any]:
    """The main job's verdict at `gpus` GPUs: `fabriclab compare` of the whole preset at that size on the
    server-wired pyramid and dual-plane (`MAIN_SCALE_SERIES`) with compare's defaults (the same resolved runs,
    so the rows are compare's and share its cache), then `at_scale_verdict`. `run_rows`: how the rows are run
    (default `fabriclab.compare.compare`; the CLI passes one that shows progress), called with compare's
    arguments."""
    from fabriclab import compare as cmp

    series = [cmp.Series(t, r) for t, r in MAIN_SCALE_SERIES]
    rows = (run_rows or cmp.compare)(preset, series, [gpus], options={}, label=preset, cache_dir=cache_dir)
    pyr, dual = ({k: getattr(r, k) for k in AT_SCALE_FIELDS} for r in rows)
    return at_scale_verdict(pyr, dual, gpus, preset)
