"""`fabriclab compare --model`: a generated LLM step weak-scaled to each size, its rows' causes (exposed
communication by process group, busbw by group, the hottest link by tier, ECMP collisions by switch role)
and the straggler variant. Expected values are worked out by hand in the comments."""
from __future__ import annotations

import json

import pytest

from fabriclab.cli import main
from fabriclab.study.spec import SpecError, WorkloadSpec
from traffic import metrics
from traffic.llm import load_config

SMALL = "gpt3-175b,model.layers=8,parallel.pp=2,global_batch=64"  # TP8 PP2: 16 GPUs a replica


@pytest.mark.parametrize("gpus, dp, batch", [
    # gpt3-175b: TP8 PP8 DP16, global batch 1536 = 96 samples a replica; TP x PP = 64 GPUs a replica
    (128, 2, 2 * 96), (256, 4, 4 * 96), (1024, 16, 1536),
])
def test_an_llm_spec_is_weak_scaled_to_each_size(gpus, dp, batch):
    cfg = load_config(WorkloadSpec.model("gpt3-175b").at(gpus).llm_spec)
    assert (cfg.parallel.tp, cfg.parallel.pp, cfg.parallel.dp, cfg.global_batch) == (8, 8, dp, batch)
    assert cfg.micro_batches == 96  # the replica's pipeline is the same at every size


def test_a_size_that_is_not_whole_replicas_is_refused_naming_the_cell():
    with pytest.raises(SpecError, match=r"96 is not a multiple of TP x CP x PP = 8 x 1 x 8 = 64"):
        WorkloadSpec.model("gpt3-175b").at(96)


def test_exposed_communication_is_split_evenly_where_groups_overlap():
    # compute [0,10] and [20,30]; dp in [5,25], ep in [12,16], pp in [22,40]. Exposed (no compute):
    # [10,12] dp alone 2; [12,16] dp and ep, 4 split 2 + 2; [16,20] dp alone 4; [30,40] pp alone 10.
    # dp 8, ep 2, pp 10: 20 in all, the step's exposed communication
    tl = metrics.StepTimeline(((0, 10), (20, 30)), ((5, 25), (12, 16), (22, 40)), 40)
    got = metrics.exposed_by_stream(tl, ["dp", "ep", "pp"])
    assert got == pytest.approx({"dp": 8.0, "ep": 2.0, "pp": 10.0})
    assert sum(got.values()) == pytest.approx(metrics.step_times(tl).exposed_comm_us)


def test_compare_model_rows_and_their_causes(tmp_path):
    out = tmp_path / "o"
    # (NVLink at its rate alone, --nvlink-latency-us 0: TP's busbw is then NVLink's)
    assert main(["compare", "--model", SMALL, "--sizes", "16", "32", "--stragglers", "stragglers.jitter_cv=0.1,steps=3",
                 "--jobs", "1", "--no-cache", "--json", "--out", str(out), "--nvlink-latency-us", "0"]) == 0
    doc = json.loads((out / "compare.json").read_text())
    rows = doc["rows"]
    # the default LLM series (rail-wired, 8-GPU servers), each without and with stragglers, at 2 sizes
    assert [(r["topology"], r["variant"], r["gpus"]) for r in rows] == [
        (t, v, n) for t in ("pyramid-1024-rail", "dual-plane-1024-rail") for v in ("", "stragglers") for n in (16, 32)]
    for r in rows:
        # the exposed communication by group adds up to the row's communication share (a different sum:
        # per step, the merged collective intervals minus their overlap with compute)
        assert sum(r["exposed_by_group"].values()) == pytest.approx(r["comm_share"], rel=1e-6)
        # 16 GPUs is one replica (DP 1): no gradient all-reduce across servers; 32 GPUs has DP 2
        assert ("dp" in r["busbw_by_group"]) == (r["gpus"] == 32)
        assert r["busbw_by_group"]["tp"] == pytest.approx(3600e9, rel=0.01)  # NVLink's 450 GB/s each way
        assert 0 < r["mfu"] < r["utilisation"] <= 1
        assert (r["steps"] == 3) == (r["variant"] == "stragglers")
    by = {(r["topology"], r["variant"], r["gpus"]): r for r in rows}
    for t in ("pyramid-1024-rail", "dual-plane-1024-rail"):
        base, slow = by[(t, "", 16)], by[(t, "stragglers", 16)]
        assert slow["step_p99_us"] > slow["step_mean_us"] > base["step_mean_us"]
        # weak scaling: efficiency = mean step at the base size over this size's
        big = by[(t, "", 32)]
        assert big["efficiency"] == pytest.approx(base["step_mean_us"] / big["step_mean_us"])
    tiers = set(by[("pyramid-1024-rail", "", 32)]["hottest_by_tier"]) | set(by[("dual-plane-1024-rail", "", 32)]["hottest_by_tier"])
    assert tiers <= {"tor->agg", "agg->tor", "agg->core", "core->agg", "leaf->spine", "spine->leaf"}
    assert doc["meta"]["stragglers"] == "stragglers.jitter_cv=0.1,steps=3"
    # the p99 figure is judged on the straggler rows, the others on the plain ones
    assert {s["metric"]: s["variant"] for s in doc["seed"]}["step_p99_us"] == "stragglers"
    assert {s["metric"]: s["variant"] for s in doc["seed"]}["step_mean_us"] == ""


@pytest.mark.parametrize("argv, message", [
    (["--model", "gpt3-175b", "--sizes", "96"], "is not a multiple of TP x CP x PP"),
    (["--model", "no-such-model"], "unknown preset"),
    (["builtin", "--stragglers"], "stragglers are a generated LLM step's"),
    (["some-trace.json", "--model", "gpt3-175b"], "give a TRACE or --model, not both"),
])
def test_compare_model_refuses_bad_input(tmp_path, capsys, argv, message):
    assert main(["compare", *argv, "--no-cache", "--out", str(tmp_path / "o")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
