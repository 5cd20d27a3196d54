"""`fabriclab compare --sensitivity` (`fabriclab.sensitivity`): the sweep's fabrics, the judgement of the
vendor's figures, their arithmetic, the straggler model's tail, and the sweep end to end on the 16-GPU
server-wired fabrics, where the pyramid's 2:1 ToR uplinks carry the pipeline. Expected values are worked
out by hand in the comments or computed here independently (scipy's lognormal, numerical integrals)."""
from __future__ import annotations

import json
import math

import pytest
from scipy import integrate, optimize, stats

from fabric import topofile
from fabric.errors import TopologyError
from fabriclab import sensitivity as sens
from fabriclab.cli import main
from fabriclab.study.main_job import MAIN_TRACE
from fabriclab.rows import Row
from fabriclab.study.verdicts import SEED


def _uplink_gbps(fab, tor: str) -> float:
    return sum(l.rate_gbps for l in fab.links
               if tor in (l.a.node, l.b.node) and {l.a.node, l.b.node} - {tor} <= set(fab.switch_by_name))


@pytest.mark.parametrize("over", [1.0, 2.0, 4.0])
def test_an_oversubscription_override_sets_the_tor_uplinks(over):
    # pyramid-1024-rail: 32 hosts of 400G under each ToR, so 32 x 400 / over Gbit/s of uplinks
    fab = topofile.scaled("pyramid-1024-rail", 1024, {"oversubscription": over})
    assert _uplink_gbps(fab, "tor0") == pytest.approx(32 * 400 / over)


def test_overrides_that_cannot_be_given_are_refused_by_name():
    with pytest.raises(TopologyError, match="'hosts' cannot be overridden"):
        topofile.scaled("pyramid-1024-rail", 1024, {"hosts": 8})
    with pytest.raises(TopologyError, match="no_such_param"):
        topofile.scaled("pyramid-1024-rail", 1024, {"no_such_param": 1})


def test_the_vendors_arithmetic():
    text = "\n".join(sens.seed_arithmetic())
    # 2.8 x (1 - 0.32) = 1.904 s; 1.9 x (1 - 0.11) = 1.691 s; 1.691 / 1.904 = 0.888: 11% less compute
    assert "2.8 s x 68% = 1.90 s" in text and "1.9 s x 89% = 1.69 s" in text and "cut compute by 11%" in text
    # 1.904 / 0.89 = 2.139 s; 2.8 / 2.139 = 1.31x; 2.8 / 1.9 = 1.47x
    assert "2.14 s (1.31x, not the 1.47x claimed)" in text
    assert "92% + communication 11% = 103%" in text and "68% + 32% = 100%" in text
    assert "4.7 / 2.8 = 1.68x" in text and "2.3 / 1.9 = 1.21x" in text


@pytest.mark.parametrize("metric, ratio, ok", [
    ("step_mean_us", 0.70, True),    # the vendor's 1.9 / 2.8 = 0.679; 0.679 / 1.25 = 0.543 <= 0.70 <= 0.848
    ("step_mean_us", 0.50, False),   # a larger gain than the vendor's, beyond the tolerance
    ("step_mean_us", 0.90, False),
    ("step_mean_us", 1.00, False),
    ("utilisation", 1.30, True),     # 0.92 / 0.68 = 1.353
    ("utilisation", 0.80, False),    # the wrong direction
])
def test_a_ratio_reproduces_a_figure_in_direction_and_size(metric, ratio, ok):
    assert sens.reproduces(metric, ratio) is ok


def _row(fabric: str, topology: str, step_s: float, **kw) -> Row:
    base = dict(topology=topology, fabric=fabric, routing="ecmp", gpus=1024, steps=1, step_mean_us=step_s * 1e6,
                step_p99_us=step_s * 1e6, utilisation=0.75, comm_share=0.2, busbw_bps=3e11, hot_link_share=0.0,
                load_max_over_mean=1.0, ecmp_collisions=0, ecmp_choices=0, efficiency=1.0)
    return Row(**(base | kw))


def test_a_figure_reproduced_only_at_a_point_names_its_condition():
    pyr, dual = "pyramid-1024-rail", "dual-plane-1024-rail"
    base = sens.PointResult("base", "the base rows", _row("p", pyr, 9.0), _row("d", dual, 9.0), ("pyramid", "dual_plane"))
    four = sens.PointResult("4:1", "the pyramid at 4:1 at the ToR", _row("p", pyr, 13.0), _row("d", dual, 9.0),
                            ("pyramid",))
    res = [sens.replace(r, ratios={m: sens._ratio(r, m) for m in SEED}) for r in (base, four)]
    got = {v["metric"]: v for v in sens.verdicts(res)}
    # 9 / 13 = 0.692: within the vendor's 0.679 x/ 1.25
    assert got["step_mean_us"]["verdict"] == "reproduced only if the pyramid at 4:1 at the ToR"
    assert got["step_mean_us"]["reproduced_at"] == ["4:1"]
    # utilisation is 0.75 in both rows: a ratio of 1 at every point
    assert got["utilisation"]["verdict"].startswith("not reproduced at any point of the sweep: closest 1x")


def test_the_straggler_tail_of_one_rank_is_the_lognormals():
    # one rank, all compute: the step is the multiplier X, lognormal of mean 1 and CV 0.3:
    # sigma^2 = ln(1.09), mu = -sigma^2 / 2; p99 / mean = exp(mu + sigma z_0.99) / 1
    cv = 0.3
    s = math.sqrt(math.log1p(cv * cv))
    want = stats.lognorm(s, scale=math.exp(-s * s / 2)).ppf(0.99)
    got, mean = sens.p99_over_mean(cv, 1, 1.0, steps=40000)
    assert got == pytest.approx(want, rel=0.03)
    assert mean == pytest.approx(1.0, rel=0.01)


def test_the_straggler_tail_of_many_ranks_is_their_maximums():
    # 64 ranks, compute 60% of the step: step = 0.4 + 0.6 max(X_1..X_64). The max's CDF is F(x)^64, so its
    # p99 is F^-1(0.99^(1/64)) and its mean the integral of 1 - F(x)^64
    cv, n, u = 0.2, 64, 0.6
    s = math.sqrt(math.log1p(cv * cv))
    dist = stats.lognorm(s, scale=math.exp(-s * s / 2))
    q = dist.ppf(0.99 ** (1 / n))
    mean_max = integrate.quad(lambda x: 1 - dist.cdf(x) ** n, 0, 20)[0]
    want = (1 - u + u * q) / (1 - u + u * mean_max)
    got, mean = sens.p99_over_mean(cv, n, u, steps=20000)
    assert got == pytest.approx(want, rel=0.02)
    assert mean == pytest.approx(1 - u + u * mean_max, rel=0.01)


def test_the_jitter_a_tail_needs_is_found_by_inverting_it():
    # one rank, all compute: p99 / mean = exp(-s^2/2 + 2.326 s) = 1.68, solved for s, then CV = sqrt(e^(s^2) - 1)
    z = stats.norm.ppf(0.99)
    s = optimize.brentq(lambda s: math.exp(-s * s / 2 + z * s) - 1.68, 1e-6, 1.0)
    want = math.sqrt(math.expm1(s * s))
    assert sens.straggler_cv_for(1.68, 1, 1.0) == pytest.approx(want, rel=0.05)
    # compute 10% of the step, CV at most 0.5: s = 0.472, X's p99 = exp(-0.111 + 2.326 x 0.472) = 2.68, so
    # p99 / mean = 0.9 + 0.1 x 2.68 = 1.17 < 1.68: not reachable in the search's range
    assert sens.straggler_cv_for(1.68, 1, 0.1, cv_max=0.5) is None


def _main_trace_sweep(out, *extra):
    return main(["compare", MAIN_TRACE, "--topology", "pyramid-16-servers", "--routing", "ecmp",
                 "--topology", "dual-plane-16-servers", "--routing", "adaptive", "--sizes", "16", "--sensitivity",
                 "--jobs", "2", "--json", "--out", str(out), *extra])


def test_the_sweep_end_to_end_on_the_main_jobs_fabrics(tmp_path):
    out, cache = tmp_path / "o", tmp_path / "cache"
    assert _main_trace_sweep(out, "--cache", str(cache)) == 0
    doc = json.loads((out / "compare.json").read_text())
    sw = doc["sensitivity"]
    assert sw["complete"] and sw["gpus"] == 16
    pts = {p["point"]: p for p in sw["points"]}
    assert list(pts) == ["base", "1:1", "4:1", "planned ports", "hashed ports", "fragmented", "kernel 0.8", "worst"]
    # which family each point ran (the others are the base rows)
    assert pts["4:1"]["ran"] == ["pyramid"] and pts["hashed ports"]["ran"] == ["dual_plane"]
    assert pts["fragmented"]["ran"] == ["pyramid", "dual_plane"]
    rows = {(r["variant"], r["topology"]): r for r in sw["rows"]}
    # the pipeline's sends leave each server through its ToR's uplinks: 4 x 400G down; up 4 x 400G at 1:1,
    # 2 x 400G at 2:1 (the base), 400G at 4:1, shared by the 4 concurrent sends: each gets at most 400 / 4 = 100
    # Gbit/s at 4:1 (200 at 2:1); at 1:1 the uplinks hold them all (above 200)
    base_pp = next(r for r in doc["rows"] if r["topology"] == "pyramid-16-servers")["busbw_by_group"]["pp"]
    assert base_pp <= 200e9 * 1.001
    assert rows[("4:1", "pyramid-16-servers")]["busbw_by_group"]["pp"] <= 100e9 * 1.001
    assert rows[("1:1", "pyramid-16-servers")]["busbw_by_group"]["pp"] > 200e9
    # so the pyramid's step falls with its oversubscription
    assert pts["1:1"]["pyramid_step_us"] < pts["base"]["pyramid_step_us"] < pts["4:1"]["pyramid_step_us"]
    assert pts["1:1"]["dual_plane_step_us"] == pts["base"]["dual_plane_step_us"]  # the dual-plane's base row
    # faster kernels shorten both steps (the compute is 1 / 0.8 against 1 / 0.5 of the FLOPs' time at peak)
    assert pts["kernel 0.8"]["dual_plane_step_us"] < pts["base"]["dual_plane_step_us"]
    assert {v["metric"] for v in sw["verdicts"]} == set(SEED)
    assert sw["stragglers"]["gpus"] == 16
    # a second run computes nothing: every row of the table and the sweep comes from the cache
    assert _main_trace_sweep(tmp_path / "o2", "--cache", str(cache)) == 0
    again = json.loads((tmp_path / "o2" / "compare.json").read_text())
    assert all(r["cached"] for r in again["rows"] + again["sensitivity"]["rows"])
    assert [p["speedup"] for p in again["sensitivity"]["points"]] == [p["speedup"] for p in sw["points"]]
