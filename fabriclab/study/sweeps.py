"""compare's and plan's studies: rows over series and sizes, the sensitivity sweep, the planner's designs, each
written as its rows finish (a stopped run keeps them), as library code that the commands call once.

    outcome = compare_study(CompareRequest(sweep, series, sizes), runner)
    outcome = plan_study(PlanRequest(sweep, gpus, designs_file), runner)

`runner(title)` gives the function that runs rows (`fabriclab.compare.compare`'s signature): the CLI passes one
that shows progress and turns SIGTERM into Ctrl-C; `plain_runner` runs them without. Rows failing do not stop the
others: the outcome lists them (`failed`) beside the rows that finished.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fabric.errors import FabriclabError
from fabriclab import compare_output as out
from fabriclab.study import verdicts
from fabriclab.study.spec import SimModel, WorkloadSpec

#: a function that runs rows, with `fabriclab.compare.compare`'s arguments
RowsRunner = Callable[..., list[Any]]


def plain_runner(title: str) -> RowsRunner:
    from fabriclab import compare as cmp

    return cmp.compare


@dataclass(frozen=True)
class SweepRequest:
    """What compare and plan share: the workload (a trace, or `llm:SPEC`) and its label, the run options
    (`RunOptions` fields but the ranks), the simulator's model, the row cache (None: none) and the output folder."""

    trace: str
    label: str
    options: dict[str, Any]
    sim: SimModel
    cache: Path | None
    out: Path

    @property
    def workload(self) -> WorkloadSpec:
        return WorkloadSpec.parse(self.trace)

    def meta(self) -> dict[str, Any]:
        """What the outputs say about the request (each row carries its resolved run too)."""
        asked = {k: v for k, v in self.options.items()
                 if not (k in ("step_ops", "launchless_kernels") and v is None or k == "ports" and v == "auto"
                         or k in ("pxn", "merge_nics") and v is True)}
        return {"options": asked, "sim": dataclasses.asdict(self.sim.options(self.workload.llm)),
                "lockstep": self.sim.lockstep, "all_to_all": self.sim.all_to_all}

    def rows(self, runner: RowsRunner, series: Sequence[Any], sizes: Sequence[int],
             on_rows: Callable[[list[Any]], None], stragglers: str | None = None) -> list[Any]:
        return runner(self.trace, series, sizes, options=self.options, sim=self.sim, label=self.label,
                      cache_dir=self.cache, on_rows=on_rows, stragglers=stragglers)


@dataclass(frozen=True)
class CompareRequest:
    sweep: SweepRequest
    series: tuple[Any, ...]  # `fabriclab.compare.Series`
    sizes: tuple[int, ...]
    stragglers: str | None = None
    sensitivity: bool = False


@dataclass
class Outcome:
    """What a study wrote: its files, the rows, the text to print, and the rows that failed."""

    paths: list[Path]
    rows: list[Any]
    text: str
    failed: list[dict[str, str]] = field(default_factory=list)


def compare_study(req: CompareRequest, runner: Callable[[str], RowsRunner]) -> Outcome:
    """`fabriclab compare`: every series at every size (`fabriclab.compare`), the vendor's figures checked
    (`seed_check`), then, if asked, the sensitivity sweep at the largest size; written to `req.sweep.out` as
    rows finish."""
    from fabriclab import compare as cmp

    sw = req.sweep
    t0 = time.monotonic()
    meta = {"trace": sw.label, "series": [s.doc() for s in req.series], "sizes": sorted(set(req.sizes)), **sw.meta(),
            **({"stragglers": req.stragglers} if req.stragglers is not None else {})}
    expected = len(req.series) * len(set(req.sizes)) * (2 if req.stragglers is not None else 1)

    def partial(rows: list[Any]) -> None:  # every finished row on disk at once: a stopped run keeps them
        out.write(rows, verdicts.seed_check(rows), sw.out, meta | {"complete": len(rows) == expected,
                                                                   "rows_expected": expected,
                                                                   "wall_s": time.monotonic() - t0}, pictures=False)

    rows: list[Any] | None = None
    try:
        rows = sw.rows(runner("compare"), req.series, req.sizes, partial, req.stragglers)
        seed = verdicts.seed_check(rows)
        meta |= {"complete": True, "rows_expected": expected, "wall_s": time.monotonic() - t0}
        sens = sensitivity_study(req, rows, seed, meta, runner) if req.sensitivity else None
    except cmp.RowsFailed as e:
        # every other row finished: written and shown with the failed ones listed (those of the table, or of
        # the sensitivity sweep after a complete table: then without its section)
        done = e.rows if rows is None else rows
        meta |= {"complete": rows is not None, "rows_expected": expected, "wall_s": time.monotonic() - t0,
                 "failed": e.failed}
        seed = verdicts.seed_check(done)
        return Outcome(out.write(done, seed, sw.out, meta), done, out.format_table(done, seed), e.failed)
    from fabriclab.sensitivity import format_section

    sens_text = format_section(sens) if sens is not None else ""
    paths = out.write(rows, seed, sw.out, meta, sens, sens_text)
    return Outcome(paths, rows, out.format_table(rows, seed) + (f"\n\n{sens_text}" if sens_text else ""))


def sensitivity_study(req: CompareRequest, rows: list[Any], seed: list[Any], meta: dict[str, Any],
                      runner: Callable[[str], RowsRunner]) -> dict[str, Any]:
    """`compare --sensitivity`: the sweep's rows at the largest size (`fabriclab.sensitivity`), cached
    like the table's, each written as it finishes; its section, with the sweep's wall time."""
    from fabriclab import sensitivity as sens_mod

    sw = req.sweep
    gpus = max(req.sizes)
    sweep = sens_mod.sweep_series(req.series, sw.workload.llm)
    if not sweep:
        raise FabriclabError("--sensitivity needs a pyramid or a dual-plane series (its points change those)")
    t0 = time.monotonic()

    def section(sweep_rows: list[Any]) -> dict[str, Any]:
        doc = sens_mod.analyse(rows, sweep_rows, gpus, sw.trace)
        return doc | {"rows": [dataclasses.asdict(r) for r in sweep_rows], "rows_expected": len(sweep),
                      "complete": len(sweep_rows) == len(sweep), "wall_s": time.monotonic() - t0}

    def partial(sweep_rows: list[Any]) -> None:
        doc = section(sweep_rows)
        out.write(rows, seed, sw.out, meta, doc, sens_mod.format_section(doc), pictures=False)

    return section(sw.rows(runner("sensitivity"), sweep, [gpus], partial))


@dataclass(frozen=True)
class PlanRequest:
    sweep: SweepRequest
    gpus: int
    designs_file: Path
    prices_file: str | None = None
    reference: bool = True


def plan_study(req: PlanRequest, runner: Callable[[str], RowsRunner]) -> Outcome:
    """`fabriclab plan`: every design of the designs file at `req.gpus`, run as compare's series
    (`fabriclab.planner`); the table, CSV, JSON and plot rewritten as each row finishes."""
    from fabric.parts import DEFAULT_PRICES
    from fabriclab import compare as cmp
    from fabriclab import plan_report, planner

    sw = req.sweep
    default_g = 8
    if sw.workload.llm:
        from traffic.llm import load_config

        default_g = load_config(sw.workload.llm_spec).gpus_per_server
        sw.workload.at(req.gpus)  # a GPU count the model cannot be split over fails here
    designs = planner.load_designs(req.designs_file)
    prices = planner.load_prices(req.prices_file) if req.prices_file else DEFAULT_PRICES
    planned = planner.resolve(designs, req.gpus, default_g)
    files = planner.write_topologies(planned, req.gpus, sw.out / "topologies")
    refs = planner.write_references(planned, req.gpus, sw.out / "topologies") if req.reference else {}
    series = planner.plan_series(planned, files, refs)
    t0 = time.monotonic()
    meta: dict[str, Any] = {"workload": sw.label, "gpus": req.gpus, "designs_file": str(req.designs_file),
                            "prices_file": req.prices_file, "series": [s.doc() for s in series], **sw.meta()}
    outputs = plan_report.Outputs(sw.out)

    def write(rows: list[Any], complete: bool, failed: list[dict[str, str]] | None = None) -> list[Path]:
        res = plan_report.results(planned, files, refs, rows, prices)
        return outputs.write(res, prices, meta | {"complete": complete, "rows_done": len(rows),
                                                  "rows_expected": len(series), "wall_s": time.monotonic() - t0,
                                                  **({"failed": failed} if failed else {})},
                             req.gpus, sw.label)

    write([], False)
    failed: list[dict[str, str]] = []
    try:
        rows = sw.rows(runner(f"plan {req.gpus} GPUs"), series, [req.gpus], lambda rows: None if write(rows, False)
                       else None)
    except cmp.RowsFailed as e:  # every other design finished: written, the failed ones listed
        rows, failed = e.rows, e.failed
    paths = write(rows, not failed, failed)
    return Outcome(paths, rows, paths[2].read_text().rstrip("\n"), failed)
