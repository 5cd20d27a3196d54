"""The CLI as a user runs it: real processes, output read back."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.real_traces import RESNET, needs

ROOT = Path(__file__).resolve().parent.parent


def run(*args, check=True):
    res = subprocess.run([sys.executable, "-m", "fabriclab.cli", *args], cwd=ROOT, capture_output=True, text=True)
    if check:
        assert res.returncode == 0, res.stderr
    return res


def test_topo_show_json_matches_hand_figures():
    data = json.loads(run("topo", "show", "topologies/dual-plane-16.yaml", "--json").stdout)
    assert data["hosts"] == 16 and data["switches"] == 12 and data["links"] == 48
    assert data["host_bandwidth_gbps"] == 400 and data["bisection_bandwidth_gbps"] == 3200
    assert (data["ecmp_paths_min"], data["ecmp_paths_max"]) == (2, 4)


def test_topo_show_text_marks_differences():
    out = run("topo", "show", "dual-plane-16", "pyramid-16").stdout
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert lines["bisection bandwidth (Gbit/s)"].endswith("*")
    assert not lines["per-host bandwidth (Gbit/s)"].endswith("*")  # same 400G per host: a fair comparison
    assert "3200" in lines["bisection bandwidth (Gbit/s)"] and "1600" in lines["bisection bandwidth (Gbit/s)"]


def test_topo_check_ok_and_bad(tmp_path):
    assert "ok: pyramid-1024: 1024 hosts" in run("topo", "check", "topologies/pyramid-1024.yaml").stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbuilder: dual_plane\nparams: {hosts: 16, hosts_per_leaf: 5}\n")
    res = run("topo", "check", str(bad), check=False)
    assert res.returncode == 2
    assert "bad.yaml" in res.stderr and "hosts (16) must be a multiple of hosts_per_leaf (5)" in res.stderr
    assert "Traceback" not in res.stderr


def test_unsupported_option_is_refused_before_anything_is_built():
    # the first link (leafA0 port 1 to spineA0) is a 400G uplink: x 10 Mbit/s per Gbit/s = 4000 Mbit/s,
    # beyond what HTB emulates; refused (exit 2) before anything is built, no root needed
    res = run("up", "dual-plane-16", "--mbps-per-gbps", "10", check=False)
    assert res.returncode == 2
    assert "link leafA0:1 -- spineA0:1" in res.stderr
    assert "4000 Mbit/s is outside what HTB emulates faithfully" in res.stderr


@needs(RESNET)
def test_trace_show_reads_a_real_trace_and_refuses_a_corrupt_one(tmp_path):
    trace = RESNET
    data = json.loads(run("trace", "show", str(trace), "--json").stdout)
    # 3 profiler steps (4, 5, 6), each with 5 all-reduces and 2 broadcasts (see tests/test_traces.py)
    assert [s["step"] for s in data["per_step"]] == [4, 5, 6]
    assert all(s["collectives"] == 7 for s in data["per_step"])
    text = run("trace", "show", str(trace)).stdout
    assert "5 all_reduce" in text and "2 broadcast" in text
    bad = tmp_path / "cut.json.gz"
    bad.write_bytes(trace.read_bytes()[:5000])
    res = run("trace", "show", str(bad), check=False)
    assert res.returncode == 2 and "cut.json.gz" in res.stderr and "Traceback" not in res.stderr


def test_replay_refuses_bad_input_before_building_anything(tmp_path):
    garbage = tmp_path / "trace.json"
    garbage.write_text("this is not a trace")
    res = run("replay", str(garbage), check=False)
    assert res.returncode == 2 and "trace.json" in res.stderr and "Traceback" not in res.stderr
    res = run("replay", "--channels", "0", check=False)
    assert res.returncode == 2 and "--channels must be >= 1" in res.stderr
    res = run("replay", "--topology", "dual-plane-16", "--topology", "pyramid-16", "--routing", "a", "--routing",
              "b", "--routing", "c", check=False)
    assert res.returncode == 2 and "one --routing per --topology" in res.stderr
    res = run("replay", "--routing", "nosuch.module:Policy", "--topology", "dual-plane-16", check=False)
    assert res.returncode == 2 and "cannot import module 'nosuch.module'" in res.stderr


def test_report_rerenders_a_run_and_refuses_a_bad_one(tmp_path):
    from tests.test_report import make_run

    run_dir = tmp_path / "run"
    make_run().write(run_dir)
    out = run("report", str(run_dir)).stdout
    assert "report.html" in out and (run_dir / "report.html").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "result.json").write_text("{}")
    res = run("report", str(tmp_path / "bad"), check=False)
    assert res.returncode == 2 and "result.json" in res.stderr and "Traceback" not in res.stderr


def test_nvls_and_collnet_are_named_and_refused_on_with_the_reason():
    # NVLS/NVLSTree and CollNet are named options, off by default (the choice made without them); on is
    # refused with why, before anything runs (exit 2, one line, no traceback)
    for name, words in (("--nvls", "NVLink SHARP"), ("--collnet", "CollNet plugin")):
        res = run("sim", "llm:gpt3-175b", name, "on", check=False)
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr
        assert f"{name} on" in res.stderr
