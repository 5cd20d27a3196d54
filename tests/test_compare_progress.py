"""`fabriclab compare` while it runs: progress on a terminal and on a piped stderr (a log, CI), every
finished row written at once, a stopped run's rows kept and reused, a failed row reported while the others
finish, and nothing left running (the local Ray instance of the command ended with it)."""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest

from fabric.routing import RoutingPolicy
from fabriclab import progress as progress_mod
from fabriclab.cli import main
from fabriclab.progress import ProgressView
from tests.ray_cluster import descendants, wait_until

BASE = ["compare", "builtin", "--topology", "pyramid-16", "--routing", "ecmp", "--topology", "dual-plane-16",
        "--routing", "adaptive", "--sizes", "8", "16", "--jobs", "1"]


def test_a_piped_stderr_gets_plain_lines_within_rows_and_as_rows_finish(tmp_path: Path, capsys, monkeypatch):
    # every report printed (the period at 0); the rows' simulator reports at its own interval, and at its start
    monkeypatch.setattr(progress_mod, "PLAIN_EVERY_S", 0.0)
    assert main([*BASE, "--out", str(tmp_path / "o"), "--no-cache"]) == 0
    err = capsys.readouterr().err.splitlines()
    within = [l for l in err if l.startswith("[compare] 0/4 done; pyramid-8 ecmp (8 GPUs): ") and " calls, " in l]
    assert within, err
    assert any("% of bytes, simulated " in l and " events/s" in l for l in within)
    assert [l for l in err if l.endswith(" done")] == [f"[compare] {k}/4 done" for k in range(1, 5)]
    assert "\x1b[" not in "".join(err)  # no terminal control codes in a log


def test_a_terminal_gets_bars_of_rows_and_of_the_row_running():
    out = io.StringIO()
    with ProgressView("compare", stream=out, terminal=True) as view:
        view.items(1, 4)
        view.running({"a": (0.5, "pyramid-1024 ecmp (1024 GPUs): 3/10 calls")})
        view._rich.refresh()
        text = out.getvalue()
    assert "compare 1/4" in text and "pyramid-1024 ecmp (1024 GPUs): 3/10 calls" in text
    quiet = io.StringIO()
    with ProgressView("compare", stream=quiet, terminal=True, quiet=True) as view:  # --json: nothing
        view.items(1, 4)
    assert quiet.getvalue() == ""


def test_a_stopped_run_keeps_its_finished_rows_and_the_next_run_reuses_them(tmp_path: Path, capsys, monkeypatch):
    out, cache = tmp_path / "o", tmp_path / "c"
    items = ProgressView.items

    def stop_after_the_first_row(self, done, total):
        items(self, done, total)
        if done == 1:
            raise KeyboardInterrupt("stopped by the test")

    monkeypatch.setattr(ProgressView, "items", stop_after_the_first_row)
    before = set(descendants(os.getpid()))
    assert main([*BASE, "--out", str(out), "--cache", str(cache)]) == 130
    # the rows' Ray instance (its GCS, raylet and workers) ended with the command
    wait_until("the command's Ray processes gone", lambda: set(descendants(os.getpid())) <= before, 30)
    kept = json.loads((out / "compare.json").read_text())
    assert kept["meta"]["complete"] is False and kept["meta"]["rows_expected"] == 4
    assert [(r["fabric"], r["cached"]) for r in kept["rows"]] == [("pyramid-8", False)]
    assert (out / "compare.csv").read_text().count("\n") == 2
    capsys.readouterr()
    monkeypatch.setattr(ProgressView, "items", items)
    assert main([*BASE, "--out", str(out), "--cache", str(cache), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["fabric"], r["cached"]) for r in rows] == [
        ("pyramid-8", True), ("pyramid-16", False), ("dual-plane-8", False), ("dual-plane-16", False)]
    assert json.loads((out / "compare.json").read_text())["meta"]["complete"] is True


class Exploding(RoutingPolicy):
    """Fails once the simulation routes its first flow (in the worker, after the sweep has started)."""

    name = "exploding"

    def egress(self, switch, dest, slot=0):
        raise RuntimeError("exploded in the worker")


@pytest.mark.parametrize("jobs", ["2", "1"])
def test_a_rows_error_is_reported_failed_and_the_others_finish(tmp_path: Path, capsys, monkeypatch, jobs):
    # on a local Ray instance (--jobs 2), and in this process (--jobs 1: no Ray session is ever opened)
    from fabriclab import sweep

    out = tmp_path / "o"
    before = set(descendants(os.getpid()))
    if jobs == "1":
        monkeypatch.setattr(sweep, "Session", None)  # any use of Ray would fail the command
    assert main(["compare", "builtin", "--topology", "pyramid-16", "--routing", "ecmp", "--topology", "dual-plane-16",
                 "--routing", "tests.test_compare_progress:Exploding", "--sizes", "8", "16", "--jobs", jobs,
                 "--out", str(out), "--no-cache"]) == 1
    doc = json.loads((out / "compare.json").read_text())
    assert [r["fabric"] for r in doc["rows"]] == ["pyramid-8", "pyramid-16"]
    assert doc["meta"]["failed"] == [
        {"row": f"dual-plane-{n} tests.test_compare_progress:Exploding ({n} GPUs)", "kind": "error",
         "error": "RuntimeError: exploded in the worker"} for n in (8, 16)]
    assert doc["meta"]["complete"] is False
    printed = capsys.readouterr().out
    assert "failed rows (2; every other row finished):" in printed
    assert "  dual-plane-16 tests.test_compare_progress:Exploding (16 GPUs): error: RuntimeError: exploded" in printed
    assert "failed rows (2" in (out / "compare.txt").read_text()
    wait_until("the command's Ray processes gone", lambda: set(descendants(os.getpid())) <= before, 30)


@pytest.mark.parametrize("model", ["exact", "lockstep", "sampled"])
def test_the_all_to_all_model_is_a_compare_option_and_part_of_the_rows_key(tmp_path: Path, capsys, model):
    args = ["compare", "builtin", "--topology", "pyramid-16", "--routing", "ecmp", "--sizes", "16", "--out",
            str(tmp_path / "o"), "--cache", str(tmp_path / "c"), "--json", "--all-to-all", model]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["all_to_all"] == model
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["cached"] is True
    other = "exact" if model != "exact" else "sampled"
    assert main([*args[:-1], other]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["cached"] is False
