"""Shared test set-up. The markers (`emulation`, `unit`, `fabric`), the CI gate (an emulation test
that cannot run fails when CI=true instead of skipping) and the fixtures (`lab`, `probe`, `faults`,
`lab_factory`) come from fabriclab's pytest plugin (`fabriclab/pytest_plugin.py`), which the package
registers, so users' own suites get the same."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric import topofile
from fabric.flowsim import Job, SimOptions, simulate
from fabric.routing import EcmpPolicy, PathTable
from fabric.transfers import Placement, Transfer, TransferDag
from tests import real_traces

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config):  # noqa: ANN001, ANN201 - pytest hook
    config.addinivalue_line("markers", f"{real_traces.MARKER}(*paths): reads these shared real traces "
                                       "(tests/real_traces.py: skipped when missing, failed when CI=true)")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):  # noqa: ANN001, ANN201 - pytest hook
    """The one rule for tests that read the shared real traces (tests/real_traces.py), checked before any
    fixture runs (an emulation test builds nothing): a missing file skips the test, and fails it in CI."""
    why = real_traces.missing_reason(tuple(p for m in item.iter_markers(real_traces.MARKER) for p in m.args))
    if why is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI has the shared traces beside the checkout, but {why}", pytrace=False)
    pytest.skip(why)


def pytest_runtest_makereport(item, call):  # noqa: ANN001, ANN201 - pytest hook
    """In CI (CI=true) a skip would hide a test that did not run: report it as a failure instead."""
    if call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception) \
            and os.environ.get("CI", "").lower() == "true":
        outcome = pytest.TestReport.from_item_and_call(item, call)
        outcome.outcome = "failed"
        outcome.longrepr = f"CI must run every test, but it was skipped: {call.excinfo.value}"
        return outcome
    return None


# ---- helpers of the flow-level simulator's tests (tests/test_flowsim*.py) -------------------------

def run(topo, jobs, **kw):
    fab = topofile.load(topo)
    options = kw.pop("options", SimOptions())
    return fab, simulate(fab, EcmpPolicy(PathTable(fab)), jobs, options=options, **kw)


def one_rank_per_host(fab, n):
    return Placement(tuple(h.name for h in fab.hosts[:n]))


def leaf_to_leaf(fab, size):
    """h0..h3 (leafA0) each send `size` bytes to h4..h7 (leafA1) at once."""
    return Job(TransferDag(tuple(Transfer(i, 4 + i, size) for i in range(4)), tuple(range(8))),
               one_rank_per_host(fab, 8))


def simulated(workload, label, fabric, routing, options, sim=None, link_events=(), all_to_all="auto"):
    """`workload` through the one pipeline on the simulator backend: its `RunResult`."""
    from fabriclab.backends import Simulated, run_workload

    backend = Simulated(sim or SimOptions(), link_events, all_to_all)
    return run_workload(workload, label, fabric, routing, options, backend).result


def replayed(workload, label, fabric, routing, options, out_dir=None, during=None):
    """`workload` through the one pipeline on the emulation backend (root): its `RunResult`."""
    from fabriclab.backends import Emulated, run_workload

    return run_workload(workload, label, fabric, routing, options, Emulated(during=during), out_dir=out_dir).result


def cli_refuses(capsys, path, *named):
    """`fabriclab trace show PATH` exits 2 with a one-line error naming the file and each of `named`."""
    from fabriclab.cli import main

    code = main(["trace", "show", str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"fabriclab: error: {path}") and "Traceback" not in err
    for text in named:
        assert text in err, (text, err)
