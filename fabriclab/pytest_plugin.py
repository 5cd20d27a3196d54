"""pytest fixtures for emulation suites users write themselves (registered by the package, `pytest11`).

    import pytest
    pytestmark = pytest.mark.emulation

    @pytest.mark.fabric("dual-plane-16", routing="adaptive")
    def test_failover_is_short(lab, probe, faults):
        run = probe("h0", "h15", plane="A", sport=49152, rate_pps=4000, seconds=4)
        run.wait_sending()
        down = faults.link_down("spineA0", 4)
        report = run.result()
        assert report.lost_in(down.at_s - 0.005, down.at_s + 0.5) < 0.1 * 4000

Run with `sudo .venv/bin/pytest -m emulation` (or `-m unit` for what needs no root). Markers:
- `emulation`: needs root and Open vSwitch; skipped without them, except when CI=true, where a skip
  would hide a failure, so the test fails instead;
- `unit`: added to every test not marked `emulation`;
- `fabric(topology, routing=..., mbps_per_gbps=..., controller_args=[...])`: what `lab` brings up
  (default: dual-plane-16, adaptive).

Fixtures: `lab` (a running `fabriclab.session.Lab`, torn down after the test even when it fails),
`faults` (its `fabric.emulation.Faults`), `probe` (starts `traffic.probe_run.ProbeRun`s in the lab,
stopped after the test), `lab_factory` (for tests that need their own fabric or several labs).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

if TYPE_CHECKING:
    from fabric.emulation import Faults
    from fabric.model import Fabric
    from fabriclab.session import Lab
    from traffic.probe_run import ProbeRun


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "emulation: needs root and Open vSwitch; builds a Mininet network "
                                       "(fails instead of skipping when CI=true)")
    config.addinivalue_line("markers", "unit: needs no root (added to every test not marked emulation)")
    config.addinivalue_line("markers", "fabric(topology, routing='adaptive', **options): the fabric `lab` brings up")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("emulation") is None and item.get_closest_marker("unit") is None:
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _fabriclab_emulation_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("emulation") is None:
        return
    from fabric.emulation.system import emulation_blocker

    why = emulation_blocker()
    if why is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run emulation tests, but: {why}")
    pytest.skip(why)


def _start_lab(topology: "str | Path | Fabric", routing: str = "adaptive", mbps_per_gbps: float = 0.1,
               controller_args: list[str] | None = None, **lab_kwargs: Any) -> "Lab":
    from fabric import topofile
    from fabric.emulation import EmulationOptions
    from fabric.model import Fabric
    from fabriclab.session import Lab

    fab = topology if isinstance(topology, Fabric) else topofile.load(topology)
    return Lab(fab, routing=routing, opts=EmulationOptions(mbps_per_gbps=mbps_per_gbps),
               controller_args=controller_args, **lab_kwargs).start()


@pytest.fixture
def lab_factory() -> Iterator[Callable[..., "Lab"]]:
    """`lab_factory(topology_or_fabric, routing=..., mbps_per_gbps=..., controller_args=[...])` starts a
    lab; every lab started is torn down after the test."""
    labs: list[Lab] = []

    def start(topology: "str | Path | Fabric", **kwargs: Any) -> "Lab":
        lab = _start_lab(topology, **kwargs)
        labs.append(lab)
        return lab

    yield start
    for lab in reversed(labs):
        lab.stop()


@pytest.fixture
def lab(request: pytest.FixtureRequest, lab_factory: Callable[..., "Lab"]) -> "Lab":
    marker = request.node.get_closest_marker("fabric")
    args = marker.args if marker else ()
    kwargs = dict(marker.kwargs) if marker else {}
    return lab_factory(args[0] if args else "dual-plane-16", **kwargs)


@pytest.fixture
def faults(lab: "Lab") -> "Faults":
    if lab.faults is None:
        raise RuntimeError("the lab has no running emulation")
    return lab.faults


@pytest.fixture
def probe(lab: "Lab", tmp_path: Path) -> Iterator[Callable[..., "ProbeRun"]]:
    """`probe(src, dst, plane="A", sport=49152, rate_pps=4000, seconds=5, port=None)` starts a paced
    probe in the lab (receiver bound before the sender starts) and returns its ProbeRun."""
    from traffic.probe_run import ProbeRun

    runs: list[ProbeRun] = []

    def start(src: str, dst: str, *, plane: str = "A", sport: int = 49152, rate_pps: float = 4000,
              seconds: float = 5.0, port: int | None = None) -> ProbeRun:
        if lab.emulation is None:
            raise RuntimeError("the lab has no running emulation")
        run = ProbeRun(lab.emulation, src, dst, plane=plane, sport=sport, rate_pps=rate_pps, seconds=seconds,
                       workdir=tmp_path, port=port if port is not None else 9000 + len(runs))
        runs.append(run)
        return run.start()

    yield start
    for run in runs:
        run.stop()
