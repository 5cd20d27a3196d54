"""Process groups of a parallel training job, in Megatron-Core's rank order (pure).

A job of `world = tp x cp x dp x pp` ranks is a grid; each parallelism is one axis of it and its
groups are the ranks that differ in that coordinate only. Megatron-Core numbers the grid in the
order `tp-cp-ep-dp-pp`, the first fastest (`megatron/core/parallel_state.py`, `RankGenerator` and
`generate_masked_orthogonal_rank_groups`):

    rank = tp + TP * (cp + CP * (dp + DP * pp))

so a tensor-parallel group is TP consecutive ranks (inside one server when TP <= its GPUs), and the
data-, pipeline- and context-parallel groups stride across servers.

MoE layers get their own grid over the same ranks, as Megatron-Core >= 0.10 does (`etp-ep-edp-pp`):
expert tensor parallelism (ETP, default TP), expert parallelism (EP) and expert data parallelism
(EDP = world / (ETP x EP x PP)):

    rank = etp + ETP * (ep + EP * (edp + EDP * pp))

With ETP = TP and CP = 1 this is the older single grid `tp-cp-ep-dp-pp` (EP carved out of DP), so
both versions give the same groups there.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from fabric.errors import FabriclabError

#: The axes of the dense grid, fastest first, and of the expert grid.
DENSE_ORDER = ("tp", "cp", "dp", "pp")
EXPERT_ORDER = ("etp", "ep", "edp", "pp")


class ParallelError(FabriclabError):
    """Parallel sizes that do not make a grid (the message names them)."""


@dataclass(frozen=True)
class ParallelGrid:
    """The rank grid of one job. `ep`/`etp` describe the MoE layers' expert grid (1: dense model)."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int | None = None  # None: the same as tp

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "cp", "ep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParallelError(f"{name} must be an integer >= 1, got {v!r}")
        etp = self.expert_tp
        if isinstance(etp, bool) or not isinstance(etp, int) or etp < 1:
            raise ParallelError(f"etp must be an integer >= 1, got {etp!r}")
        if (self.world // self.pp) % (etp * self.ep):
            raise ParallelError(f"expert grid: etp x ep = {etp} x {self.ep} must divide the ranks of a pipeline "
                                f"stage (tp x cp x dp = {self.world // self.pp})")

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp

    @property
    def edp(self) -> int:
        """Expert data parallelism: the replicas of each expert."""
        return self.world // (self.expert_tp * self.ep * self.pp)

    # ---- coordinates -------------------------------------------------------------------------
    def coords(self, rank: int) -> dict[str, int]:
        """The rank's dense-grid coordinates {tp, cp, dp, pp}."""
        return _decompose(rank, DENSE_ORDER, (self.tp, self.cp, self.dp, self.pp))

    def expert_coords(self, rank: int) -> dict[str, int]:
        """The rank's expert-grid coordinates {etp, ep, edp, pp}."""
        return _decompose(rank, EXPERT_ORDER, (self.expert_tp, self.ep, self.edp, self.pp))

    def rank(self, tp: int = 0, cp: int = 0, dp: int = 0, pp: int = 0) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    # ---- groups ------------------------------------------------------------------------------
    def groups(self, axis: str) -> tuple[tuple[int, ...], ...]:
        """Every group of one axis ("tp", "cp", "dp", "pp", or the expert grid's "etp", "ep", "edp"), each
        as its ranks ascending; the groups ordered by their lowest rank."""
        return self._groups[axis]

    def group_of(self, axis: str, rank: int) -> tuple[int, ...]:
        return self._group_index[axis][rank]

    @cached_property
    def _groups(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        out = {}
        for order, sizes in ((DENSE_ORDER, (self.tp, self.cp, self.dp, self.pp)),
                             (EXPERT_ORDER, (self.expert_tp, self.ep, self.edp, self.pp))):
            for i, axis in enumerate(order):
                if axis == "pp" and "pp" in out:
                    continue
                out[axis] = _axis_groups(sizes, i)
        return out

    @cached_property
    def _group_index(self) -> dict[str, list[tuple[int, ...]]]:
        out: dict[str, list[tuple[int, ...]]] = {}
        for axis, groups in self._groups.items():
            by_rank: list[tuple[int, ...]] = [()] * self.world
            for g in groups:
                for r in g:
                    by_rank[r] = g
            out[axis] = by_rank
        return out


def _decompose(rank: int, order: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, int]:
    out = {}
    for axis, size in zip(order, sizes):
        out[axis] = rank % size
        rank //= size
    return out


def _axis_groups(sizes: tuple[int, ...], axis: int) -> tuple[tuple[int, ...], ...]:
    """The groups along axis `axis` of a grid of `sizes` (fastest first): ranks equal in every other axis."""
    stride = 1
    for s in sizes[:axis]:
        stride *= s
    world = 1
    for s in sizes:
        world *= s
    groups = []
    for base in range(world):
        if (base // stride) % sizes[axis]:
            continue  # not the group's first member
        groups.append(tuple(base + k * stride for k in range(sizes[axis])))
    return tuple(sorted(groups))
