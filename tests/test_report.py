"""The report of a run: summary figures, CSV rows, plots, the self-contained page and the comparison.

Runs are built by hand here; every expected value is worked out by hand in the test."""
from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from traffic.report import (compare, format_comparison, format_summary, slowest_steps, summarize, write_comparison,
                            write_report)
from traffic.results import (CollectiveResult, Fidelity, LinkSeries, ResultError, RunMeta, RunResult, StepResult,
                             load_result)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# --- a hand-made run ----------------------------------------------------------------------------------

def _meta(**over: object) -> RunMeta:
    base = RunMeta(trace="builtin:mlp", trace_format="kineto", workload="mlp", backend="emulation",
                   topology="dual_plane", routing="adaptive", ranks=4, hosts=4, placement="block", algorithm="auto",
                   channels=2, mbps_per_gbps=5.0, dilation=1000.0, bytes_scale=5.0, compute="composed", repeat=2,
                   steps_recorded=3, started_wall=1_790_000_000.0, duration_s=120.0, notes=("hand-made",))
    return replace(base, **over)  # type: ignore[arg-type]


def _coll(index: int, kind: str, size_bytes: int, duration_real_us: float, start_emu_s: float,
          factor: float) -> CollectiveResult:
    """A collective whose algbw / busbw follow the definitions: size x 8 / seconds, x the nccl-tests factor."""
    algbw = size_bytes * 8 / (duration_real_us / 1e6)
    return CollectiveResult(index=index, step=1, repeat=0, kind=kind, algorithm="ring", size_bytes=size_bytes,
                            emu_bytes=size_bytes * 5, group_size=4, stream="0", transfers=24,
                            start_emu_s=start_emu_s, duration_emu_s=duration_real_us / 1000,
                            duration_real_us=duration_real_us, algbw_bps=algbw, busbw_bps=algbw * factor)


AR, AG = 2 * 3 / 4, 3 / 4  # busbw factors over 4 ranks: all-reduce 2(n-1)/n, all-gather (n-1)/n

# emulated spans (s): [0,1) [0,2) [2,6) [6,6.5) [8,13) [2,3) [13,16) [16,16.1)
# -> collectives ran during [0, 6.5) and [8, 16.1)
COLLECTIVES = (
    _coll(0, "all_reduce", 1_000_000, 1000.0, 0.0, AR),  # algbw 8e9, busbw 1.2e10
    _coll(1, "all_reduce", 4_000_000, 2000.0, 0.0, AR),  # 1.6e10, 2.4e10 (class [2^21, 2^22))
    _coll(2, "all_reduce", 4_194_304, 4000.0, 2.0, AR),  # 2^22 B: 8.388608e9, 1.2582912e10 (class [2^22, 2^23))
    _coll(3, "all_reduce", 3_000_000, 500.0, 6.0, AR),  # 4.8e10, 7.2e10
    _coll(4, "all_reduce", 5_000_000, 5000.0, 8.0, AR),  # 8e9, 1.2e10 (class [2^22, 2^23))
    _coll(5, "all_gather", 2_000_000, 1000.0, 2.0, AG),  # 1.6e10, 1.2e10
    _coll(6, "all_gather", 2_000_000, 3000.0, 13.0, AG),  # 5.333e9, 4e9
    replace(_coll(7, "barrier", 0, 100.0, 16.0, 0.0), algbw_bps=0.0, busbw_bps=0.0),
)


def _step(step: int, repeat: int, rank: int, compute: float, exposed: float, idle: float) -> StepResult:
    return StepResult(step=step, repeat=repeat, rank=rank, step_us=compute + exposed + idle, compute_us=compute,
                      exposed_comm_us=exposed, idle_us=idle, recorded_step_us=100_000.0 if repeat == 0 else None)


STEPS = (
    _step(1, 0, 0, 80_000, 15_000, 5_000),  # 100 ms
    _step(1, 0, 1, 80_000, 20_000, 10_000),  # 110 ms: the slowest of step 1 / repeat 0 (no rank -1 row)
    _step(2, 0, 0, 90_000, 25_000, 5_000),  # 120 ms
    _step(2, 0, 1, 70_000, 15_000, 5_000),  # 90 ms
    _step(2, 0, -1, 100_000, 20_000, 5_000),  # 125 ms: the composed slowest rank, taken
    _step(3, 0, -1, 70_000, 25_000, 5_000),  # 100 ms
    _step(1, 1, 0, 100_000, 25_000, 5_000),  # 130 ms
    _step(2, 1, 0, 70_000, 20_000, 5_000),  # 95 ms
    _step(3, 1, 0, 100_000, 390_000, 10_000),  # 500 ms: the tail
)
CHOSEN_STEP_US = [110_000, 125_000, 100_000, 130_000, 95_000, 500_000]  # in (repeat, step) order

# link samples of 2 s: the emulated seconds of each during which a collective ran (from the spans above)
ACTIVE_S = [2, 2, 2, 0.5, 2, 2, 2, 2, 0.1, 0] + [0] * 10
ACTIVE = [i for i, w in enumerate(ACTIVE_S) if w > 0]


def _link(switch: str, port: int, peer: str, tier: str, plane: str, util: list[float]) -> LinkSeries:
    return LinkSeries(switch=switch, port=port, peer=peer, capacity_bps=5e6, tier=tier, plane=plane,
                      emu_bytes=1000 * (port + 1), util=tuple(util))


LINKS = (
    _link("leafA1", 1, "h0", "host", "A", [0.5] * 20),  # 0.5 throughout
    _link("leafA1", 5, "spineA1", "fabric", "A", [0.8 if i in ACTIVE else 0.0 for i in range(20)]),  # 0.8 when busy
    _link("leafB1", 5, "spineB1", "fabric", "B", [0.0 if i in ACTIVE else 1.0 for i in range(20)]),  # busy when idle
    _link("leafB1", 1, "h0", "host", "B", [1.0 if i == 3 else 0.0 for i in range(10)]),  # a shorter series
)


def make_run(**over: object) -> RunResult:
    run = RunResult(
        meta=_meta(), collectives=COLLECTIVES, steps=STEPS, link_interval_s=2.0, links=LINKS,
        fidelity=Fidelity(cpu_idle_share=0.42, cpu_bound=False,
                          busiest_links=({"link": "leafA1:5->spineA1", "delivered_bps": 4.5e6, "bound_bps": 5e6,
                                          "ratio": 0.9},),
                          warnings=("plane B: 3 retransmissions during step 2",)),
        faults=({"kind": "link", "target": "leafA1-spineA1", "up": False, "at_emu_s": 8.0},),
        events=({"kind": "reroute", "flow": "h0->h3", "at_emu_s": 8.2},))
    return replace(run, **over)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("report")
    return out, write_report(make_run(), out)


# --- summary ------------------------------------------------------------------------------------------

def test_step_times_are_the_slowest_ranks_with_nearest_rank_tails() -> None:
    assert [s.step_us for s in slowest_steps(STEPS)] == CHOSEN_STEP_US
    assert [s.rank for s in slowest_steps(STEPS)] == [1, -1, -1, 0, 0, 0]
    p = summarize(make_run()).step_time_us
    assert p is not None
    # sorted: 95, 100, 110, 125, 130, 500 ms; nearest rank: p50 = 3rd of 6, p99 = 6th (ceil 5.94), p999 = 6th
    assert (p.n, p.p50, p.p99, p.p999, p.max) == (6, 110_000, 500_000, 500_000, 500_000)
    assert p.mean == pytest.approx(1_060_000 / 6)


def test_utilisation_and_communication_share() -> None:
    s = summarize(make_run())
    # chosen rows: compute 80+100+70+100+70+100 = 520 ms, exposed 20+20+25+25+20+390 = 500 ms, step 1060 ms
    assert s.utilisation_pooled == pytest.approx(520 / 1060)
    assert s.comm_share_pooled == pytest.approx(500 / 1060)
    assert s.utilisation_mean == pytest.approx((80 / 110 + 100 / 125 + 70 / 100 + 100 / 130 + 70 / 95 + 100 / 500) / 6)
    assert s.comm_share_mean == pytest.approx((20 / 110 + 20 / 125 + 25 / 100 + 25 / 130 + 20 / 95 + 390 / 500) / 6)
    assert s.identity_max_residual_us == 0
    assert s.checks == ()


def test_per_kind_counts_latency_and_bandwidth() -> None:
    s = summarize(make_run())
    assert [k.kind for k in s.kinds] == ["all_reduce", "all_gather", "barrier"]
    ar = s.kind("all_reduce")
    assert ar is not None
    assert (ar.count, ar.total_bytes) == (5, 1_000_000 + 4_000_000 + 4_194_304 + 3_000_000 + 5_000_000)
    # durations 500, 1000, 2000, 4000, 5000 us: p50 = 3rd of 5, p99 and p999 = 5th
    assert (ar.latency_us.n, ar.latency_us.p50, ar.latency_us.p99, ar.latency_us.p999) == (5, 2000, 5000, 5000)
    assert ar.mean_algbw_bps == pytest.approx((8e9 + 1.6e10 + 8.388608e9 + 4.8e10 + 8e9) / 5)
    assert ar.mean_busbw_bps == pytest.approx((1.2e10 + 2.4e10 + 1.2582912e10 + 7.2e10 + 1.2e10) / 5)
    # largest power-of-two class [4 MiB, 8 MiB): the 4,194,304 B and 5,000,000 B all-reduces, not the 4,000,000 B one
    assert (ar.largest_class_bytes, ar.largest_class_count) == (4_194_304, 2)
    assert ar.largest_class_busbw_bps == pytest.approx((1.2582912e10 + 1.2e10) / 2)
    ag = s.kind("all_gather")
    assert ag is not None and ag.mean_busbw_bps == pytest.approx((1.2e10 + 4e9) / 2)
    barrier = s.kind("barrier")
    assert barrier is not None and barrier.count == 1 and barrier.mean_busbw_bps is None
    assert barrier.largest_class_bytes is None


def test_hottest_link_is_rated_while_collectives_ran() -> None:
    s = summarize(make_run())
    # leafB1:5 has the highest plain mean (11 of 20 samples at 1.0) but was idle whenever a collective ran
    assert s.hottest_link is not None
    assert (s.hottest_link.name, s.hottest_link.tier, s.hottest_link.active_util) == ("leafA1:5->spineA1", "fabric",
                                                                                      pytest.approx(0.8))
    assert [(h.tier, h.name) for h in s.hottest_by_tier] == [("host", "leafA1:1->h0"), ("fabric", "leafA1:5->spineA1")]


def test_link_samples_are_weighted_by_their_overlap_with_collectives(report_dir: tuple[Path, list[Path]]) -> None:
    rows = {r["name"]: r for r in _csv(report_dir[0] / "links.csv")}
    # leafB1:1 is busy in sample 3 only, [6, 8) s, of which 0.5 s saw a collective; the active seconds add up to
    # 2+2+2+0.5+2+2+2+2+0.1 = 14.6 s
    assert float(rows["leafB1:1->h0"]["active_util"]) == pytest.approx(0.5 / 14.6)
    assert float(rows["leafB1:1->h0"]["mean_util"]) == pytest.approx(0.1)
    assert float(rows["leafB1:5->spineB1"]["active_util"]) == 0.0
    # busy in the 11 samples no collective touched: 9 and 10..19
    assert float(rows["leafB1:5->spineB1"]["mean_util"]) == pytest.approx(11 / 20)
    assert float(rows["leafB1:5->spineB1"]["max_util"]) == 1.0
    assert rows["leafA1:5->spineA1"]["bytes"] == "6000" and rows["leafA1:5->spineA1"]["tier"] == "fabric"


def test_inconsistent_records_are_reported_not_hidden() -> None:
    bad_step = replace(STEPS[0], idle_us=7_000.0)  # 80 + 15 + 7 != 100 ms
    bad_coll = replace(COLLECTIVES[5], busbw_bps=COLLECTIVES[5].algbw_bps)  # factor 1 instead of 3/4
    s = summarize(make_run(steps=(bad_step,) + STEPS[1:], collectives=COLLECTIVES[:5] + (bad_coll,) + COLLECTIVES[6:]))
    assert s.identity_max_residual_us == pytest.approx(2_000)
    assert len(s.checks) == 2
    assert "fails in 1 of 9 step rows" in s.checks[0] and "step 1 repeat 0 rank 0" in s.checks[0]
    assert s.checks[1].startswith("all_gather: 1 of 2 collectives") and "index 5" in s.checks[1]


def test_an_empty_run_summarizes_and_renders(tmp_path: Path) -> None:
    run = make_run(collectives=(), steps=(), links=())
    s = summarize(run)
    assert (s.step_time_us, s.kinds, s.hottest_link, s.utilisation_pooled) == (None, (), None, None)
    paths = write_report(run, tmp_path)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in paths if p.suffix == ".png")
    assert "steps        none recorded" in format_summary(s)
    assert "No steps recorded" in (tmp_path / "report.html").read_text(encoding="utf-8")


# --- files --------------------------------------------------------------------------------------------

def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_report_files(report_dir: tuple[Path, list[Path]]) -> None:
    out, paths = report_dir
    assert [p.name for p in paths] == ["summary.json", "collectives.csv", "steps.csv", "links.csv", "step_times.png",
                                       "collective_latency_cdf.png", "link_utilisation.png", "report.html"]
    assert all(p.parent == out and p.is_file() for p in paths)


def test_collectives_and_steps_csv(report_dir: tuple[Path, list[Path]]) -> None:
    colls = _csv(report_dir[0] / "collectives.csv")
    assert [r["index"] for r in colls] == [str(i) for i in range(8)]
    c2 = colls[2]
    assert (c2["kind"], c2["size_bytes"], float(c2["duration_real_us"]), float(c2["busbw_bps"])) == \
        ("all_reduce", "4194304", 4000.0, pytest.approx(1.2582912e10))
    steps = _csv(report_dir[0] / "steps.csv")
    assert len(steps) == 9
    slowest = [(r["repeat"], r["step"], r["rank"]) for r in steps if r["slowest"] == "1"]
    assert slowest == [("0", "1", "1"), ("0", "2", "-1"), ("0", "3", "-1"), ("1", "1", "0"), ("1", "2", "0"),
                       ("1", "3", "0")]
    tail = next(r for r in steps if float(r["step_us"]) == 500_000)
    assert float(tail["comm_share"]) == pytest.approx(390 / 500) and tail["recorded_step_us"] == ""


def test_plots_are_png(report_dir: tuple[Path, list[Path]]) -> None:
    for name in ("step_times.png", "collective_latency_cdf.png", "link_utilisation.png"):
        data = (report_dir[0] / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert data[-8:-4] == b"IEND", name  # complete
        assert len(data) > 10_000, name  # something drawn, not a blank canvas


def test_report_html_is_one_self_contained_page(report_dir: tuple[Path, list[Path]]) -> None:
    page = (report_dir[0] / "report.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 3
    assert "http://" not in page and "https://" not in page
    assert re.findall(r'(?:src|href)="(?!data:)', page) == [] and "<script" not in page and "<link" not in page
    assert "plane B: 3 retransmissions during step 2" in page  # the fidelity warning
    assert "Not CPU-bound" in page and "42.0 %" in page
    assert "divided by 1000" in page and "composed" in page
    assert "leafA1-spineA1" in page and "reroute" in page  # the fault and the controller event
    assert "8.000 s emulated = 8.000 ms real" in page  # times to four figures (traffic.formatting.format_us)
    assert "110.0 ms" in page and "500.0 ms" in page  # p50 and p99 of the step times, with units


def test_summary_json_and_result_round_trip(report_dir: tuple[Path, list[Path]], tmp_path: Path) -> None:
    run = make_run()
    again = load_result(run.write(tmp_path))
    assert again == run
    assert load_result(tmp_path) == run  # the directory holding result.json
    written = json.loads((report_dir[0] / "summary.json").read_text())
    assert written == json.loads(json.dumps(summarize(again).to_dict()))


@pytest.mark.parametrize("text,problem", [("{not json", "not JSON"),
                                          ('{"schema": 1, "meta": {"trace": "x"}}', "not a fabriclab result"),
                                          ('{"schema": 99}', "schema 99 is not 1")])
def test_malformed_result_names_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "result.json"
    path.write_text(text)
    with pytest.raises(ResultError, match=re.escape(str(path))) as err:
        load_result(path)
    assert problem in str(err.value)


# --- comparison ---------------------------------------------------------------------------------------

def _slower_run() -> RunResult:
    """b: steps 1.5x as long, collectives twice as long (half the bandwidth), the fabric link half as busy."""
    steps = tuple(_step(s.step, s.repeat, s.rank, s.compute_us * 1.5, s.exposed_comm_us * 1.5, s.idle_us * 1.5)
                  for s in STEPS)
    colls = tuple(replace(c, duration_real_us=c.duration_real_us * 2, algbw_bps=c.algbw_bps / 2,
                          busbw_bps=c.busbw_bps / 2) for c in COLLECTIVES)
    links = (LINKS[0], replace(LINKS[1], util=tuple(u / 2 for u in LINKS[1].util))) + LINKS[2:]
    return make_run(meta=_meta(topology="pyramid", routing="ecmp"), steps=steps, collectives=colls, links=links,
                    fidelity=Fidelity(cpu_idle_share=0.05, cpu_bound=True, busiest_links=(), warnings=("a", "b")))


def test_comparison_ratios() -> None:
    c = compare(make_run(), _slower_run())
    assert (c.a.label, c.b.label, c.warnings) == ("dual_plane / adaptive", "pyramid / ecmp", ())
    assert c.row("step time mean").ratio == pytest.approx(1.5)
    assert (c.row("step time p99").a, c.row("step time p99").b) == (500_000, 750_000)
    assert c.row("busbw all_reduce").ratio == pytest.approx(0.5)
    assert c.row("busbw all_gather, largest size class").ratio == pytest.approx(0.5)
    assert c.row("communication share").ratio == pytest.approx(1.0)
    hot = c.row("hottest link utilisation")  # b's fabric link at 0.4 is cooler than its host link at 0.5
    assert (hot.a, hot.b, hot.ratio) == (pytest.approx(0.8), pytest.approx(0.5), pytest.approx(0.625))
    assert (hot.a_note, hot.b_note) == ("leafA1:5->spineA1 (fabric, plane A)", "leafA1:1->h0 (host, plane A)")
    assert (c.row("CPU idle").b_note, c.row("fidelity warnings").b) == ("CPU-bound", 2)
    assert not any(r.metric.startswith("busbw barrier") for r in c.rows)  # no data moved: no bandwidth row
    with pytest.raises(KeyError, match="no comparison row 'nope'"):
        c.row("nope")


def test_comparison_warns_when_the_runs_replayed_different_things() -> None:
    c = compare(make_run(), make_run(meta=_meta(trace="other.json", ranks=8)))
    assert c.warnings == ("the runs differ in trace: 'builtin:mlp' (a) vs 'other.json' (b)",
                          "the runs differ in ranks: 4 (a) vs 8 (b)")
    assert all(math.isclose(r.ratio, 1.0) for r in c.rows if r.ratio is not None)


def test_comparison_files(tmp_path: Path) -> None:
    paths = write_comparison(make_run(), _slower_run(), tmp_path)
    assert [p.name for p in paths] == ["comparison.json", "comparison.html"]
    data = json.loads(paths[0].read_text())
    assert data["a"]["label"] == "dual_plane / adaptive"
    assert next(r for r in data["rows"] if r["metric"] == "step time mean")["ratio"] == pytest.approx(1.5)
    page = paths[1].read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 6
    assert "http://" not in page and "https://" not in page and "CPU-bound: the CPU was idle only 5.0 %" in page


def test_text_renderings() -> None:
    lines = format_comparison(compare(make_run(), _slower_run())).splitlines()
    blank = lines.index("", 3)
    table, notes = lines[3:blank], lines[blank + 1:]
    assert table[0].split() == ["metric", "a", "b", "b/a"] and len(table) == 11
    assert len({len(line) for line in table}) == 1  # aligned: the last column is right-aligned
    assert any(line.startswith("step time mean") and line.endswith("1.500x") for line in table)
    assert notes == ["hottest link utilisation: a leafA1:5->spineA1 (fabric, plane A); b leafA1:1->h0 (host, plane A)",
                     "CPU idle: a not CPU-bound; b CPU-bound"]
    summary = format_summary(summarize(make_run()))
    assert "n=6" in summary and "p50 110.0 ms" in summary and "p99 500.0 ms" in summary
    assert "hottest fabric leafA1:5->spineA1 (fabric, plane A): 80.0 % while collectives ran" in summary
    assert "warning      plane B: 3 retransmissions during step 2" in summary
