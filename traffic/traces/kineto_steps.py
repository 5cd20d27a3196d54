"""A Kineto trace's steps (`steps_of`) and the step boundaries in time and in correlation ids (`Boundaries`),
which tell the step a kernel was launched in (see `traffic.traces.kineto`)."""
from __future__ import annotations

import bisect

from traffic.traces.kineto_events import Pass1


def steps_of(p: Pass1, notes: list[str]) -> list[tuple[int, float, float]]:
    """(number, start_us, end_us) by start; overlapping markers are cut at the next step's start."""
    if not p.steps:
        if p.first_us == float("inf"):
            return []
        notes.append("no ProfilerStep markers: the whole trace is taken as one step (0)")
        return [(0, p.first_us, p.last_us)]
    ordered = sorted((start, end, number) for number, (start, end) in p.steps.items())
    out = []
    for i, (start, end, number) in enumerate(ordered):
        if i + 1 < len(ordered):
            end = min(end, ordered[i + 1][0])
        out.append((number, start, end))
    return out


class Boundaries:
    """Step boundaries in time, and what a correlation id says about which side of each a launch was.

    Region r = the number of boundaries (step starts and ends, in order) at or before a time: region 2i+1 is step
    i, even regions lie between steps. Correlation ids grow with launch time, so from the sampled launches, for
    boundary j: ids <= lo[j] were launched before it and ids >= hi[j] after it; ids in between are ambiguous and
    resolved from their own launch in pass 2."""

    def __init__(self, steps: list[tuple[int, float, float]], p: Pass1) -> None:
        self.times = [t for _, start, end in steps for t in (start, end)]
        samples = list(p.samples)
        for extreme in (p.min_launch, p.max_launch):
            if extreme is not None:
                samples.append(extreme)
        samples.sort(key=lambda s: s[1])
        self.lo: list[float] = []
        self.hi: list[float] = []
        if not samples:
            return
        ts = [s[1] for s in samples]
        prefix_max: list[int] = []
        for corr, _ in samples:
            prefix_max.append(max(corr, prefix_max[-1]) if prefix_max else corr)
        suffix_min = [0] * len(samples)
        running: int | None = None
        for i in range(len(samples) - 1, -1, -1):
            running = samples[i][0] if running is None else min(running, samples[i][0])
            suffix_min[i] = running
        below = min(s[0] for s in samples) - 1
        above = max(s[0] for s in samples) + 1
        for t in self.times:
            i = bisect.bisect_left(ts, t)
            self.lo.append(prefix_max[i - 1] if i > 0 else below)
            self.hi.append(suffix_min[i] if i < len(samples) else above)

    @property
    def linkable(self) -> bool:
        return bool(self.lo)

    def region_of_time(self, t: float) -> int:
        return bisect.bisect_right(self.times, t)

    def region_of_correlation(self, corr: int) -> int | None:
        surely_after = min(bisect.bisect_right(self.hi, corr), bisect.bisect_left(self.lo, corr))
        maybe_after = max(bisect.bisect_right(self.hi, corr), bisect.bisect_left(self.lo, corr))
        return surely_after if surely_after == maybe_after else None


def step_index(region: int) -> int | None:
    return (region - 1) // 2 if region % 2 == 1 else None

