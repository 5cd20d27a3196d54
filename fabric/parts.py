"""The parts a fabric is built from, counted from the model, and their cost (`fabriclab plan`).

A model link has a rate; the parts carry it on physical links of a port speed:

- a host link (a NIC port to its edge switch) is one physical link at its own rate: one NIC port, one
  switch port;
- a switch-to-switch link of rate R is ceil(R / port_gbps) physical links at `port_gbps` (the model's
  thin uplinks of an oversubscribed tier become fewer ports, not slower ones); where R is not a whole
  number of ports the parts carry more than the model (`Bill.rounded_up_gbps`);
- every physical link is two optical transceivers (one at each end, the NIC's end included) and one
  cable. A user who cables with AOCs or DACs prices `optic` at half a cable's price, or 0 and the whole
  cable in `link`.

A switch's radix is its physical ports (host ports and uplinks, at their speeds). The bill is a list of
`Part` lines (kind, tier, size, count): switches by role and radix, switch ports, optics and links by
tier and speed, NIC ports by speed. Tiers are named by the roles the links join, lower first
(`host-tor`, `tor-agg`, `agg-core`, `host-leaf`, `leaf-spine`, `leaf-leaf` for a leaf mesh).

Prices are per part kind, in units the user names (`Prices.unit`), each either one figure for every
size or figures by size (radix for switches, Gbit/s for the others) with an optional `default`. The
default prices are 1 unit per switch port and 1 per optic, nothing for the rest.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from fabric.errors import TopologyError
from fabric.model import ROLE_TIER, Fabric

#: the part kinds, in the order a bill lists them
KINDS = ("switch", "switch_port", "optic", "link", "nic_port")
#: what a part's size is, per kind
SIZE_OF = {"switch": "ports (radix)", "switch_port": "Gbit/s", "optic": "Gbit/s", "link": "Gbit/s",
           "nic_port": "Gbit/s"}
#: optical transceivers per physical link: one at each end
OPTICS_PER_LINK = 2
#: a link rate within this share above a whole number of ports needs no extra port (float noise)
_ROUND_TOLERANCE = 1e-9


class PartsError(TopologyError):
    """Parts cannot be counted or priced; the message names the part kind or the price."""


@dataclass(frozen=True)
class Part:
    """One line of a bill: `count` parts of `kind` in `tier` (a switch's role, or a link tier), of `size`
    (a switch's radix in ports; a port's, optic's or link's speed in Gbit/s)."""

    kind: str
    tier: str
    size: float
    count: int


@dataclass(frozen=True)
class Bill:
    fabric: str
    port_gbps: float  # the speed of switch-to-switch ports
    parts: tuple[Part, ...]
    rounded_up_gbps: float  # physical switch-to-switch capacity above the model's links (both directions once)

    def total(self, kind: str) -> int:
        return sum(p.count for p in self.parts if p.kind == kind)

    def by_tier(self, kind: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for p in self.parts:
            if p.kind == kind:
                out[p.tier] += p.count
        return dict(out)

    def switches(self) -> list[Part]:
        """The switch lines: per role, the count of switches of each radix."""
        return [p for p in self.parts if p.kind == "switch"]


def _tier(fab: Fabric, a: str, b: str) -> str:
    roles = [fab.switch_by_name[n].role if n in fab.switch_by_name else "host" for n in (a, b)]
    roles.sort(key=lambda r: ROLE_TIER.get(r, 0))
    return f"{roles[0]}-{roles[1]}"


def lanes(rate_gbps: float, port_gbps: float) -> int:
    """Physical links of `port_gbps` that carry a model link of `rate_gbps` (at least one)."""
    return max(1, math.ceil(rate_gbps / port_gbps - _ROUND_TOLERANCE))


def bill(fab: Fabric, port_gbps: float | None = None) -> Bill:
    """The parts of `fab` (module docstring); `port_gbps`: the speed of switch-to-switch ports (default:
    the fastest host NIC port of the fabric)."""
    host_rates = [p.rate_gbps for p in fab.nic_ports]
    speed = float(port_gbps if port_gbps is not None else max(host_rates))
    if not (math.isfinite(speed) and speed > 0):
        raise PartsError(f"{fab.name}: port_gbps must be > 0, got {speed:g}")
    switch_ports: dict[str, Counter[float]] = defaultdict(Counter)  # switch -> speed -> ports
    lines: Counter[tuple[str, str, float]] = Counter()  # (kind, tier, size) -> count
    extra = 0.0
    for link in fab.links:
        a, b = link.a.node, link.b.node
        tier = _tier(fab, a, b)
        host = next((n for n in (a, b) if n not in fab.switch_by_name), None)
        if host is not None:
            n, s = 1, link.rate_gbps
            lines[("nic_port", tier, s)] += 1
        else:
            n, s = lanes(link.rate_gbps, speed), speed
            extra += n * s - link.rate_gbps
        for end in (a, b):
            if end in fab.switch_by_name:
                switch_ports[end][s] += n
                lines[("switch_port", tier, s)] += n
        lines[("optic", tier, s)] += OPTICS_PER_LINK * n
        lines[("link", tier, s)] += n
    for sw in fab.switches:
        lines[("switch", sw.role, float(sum(switch_ports[sw.name].values())))] += 1
    kind_order = {k: i for i, k in enumerate(KINDS)}

    def order(item: tuple[tuple[str, str, float], int]) -> tuple[int, int, str, float]:
        (kind, tier, size), _ = item
        rank = ROLE_TIER.get(tier, max((ROLE_TIER.get(r, 0) for r in tier.split("-")), default=0))
        return kind_order[kind], rank, tier, size

    parts = tuple(Part(k, t, s, c) for (k, t, s), c in sorted(lines.items(), key=order))
    return Bill(fab.name, speed, parts, extra)


class Prices(BaseModel):
    """Prices per part kind (module docstring): a figure, or figures by size with an optional `default`.
    Kinds not given keep `DEFAULT_PRICES`'."""

    model_config = ConfigDict(extra="forbid")
    unit: str = "units"
    switch: float | dict[str, float] = Field(default=0.0)
    switch_port: float | dict[str, float] = Field(default=1.0)
    optic: float | dict[str, float] = Field(default=1.0)
    link: float | dict[str, float] = Field(default=0.0)
    nic_port: float | dict[str, float] = Field(default=0.0)

    @pydantic.field_validator("switch", "switch_port", "optic", "link", "nic_port")
    @classmethod
    def _sizes(cls, v: float | dict[str, float]) -> float | dict[str, float]:
        figures = v.values() if isinstance(v, dict) else [v]
        if any(not (math.isfinite(x) and x >= 0) for x in figures):
            raise ValueError("prices must be finite and >= 0")
        if isinstance(v, dict):
            for key in v:
                if key != "default":
                    try:
                        size = float(key)
                    except ValueError:
                        raise ValueError(f"a size is a number or 'default', got {key!r}") from None
                    if not size > 0:
                        raise ValueError(f"a size must be > 0, got {key!r}")
        return v

    def price(self, kind: str, size: float) -> float:
        v: float | dict[str, float] = getattr(self, kind)
        if not isinstance(v, dict):
            return float(v)
        for key, figure in v.items():
            if key != "default" and math.isclose(float(key), size):
                return float(figure)
        if "default" in v:
            return float(v["default"])
        raise PartsError(f"prices: {kind} has no price for {size:g} {SIZE_OF[kind]} and no 'default' "
                         f"(priced: {', '.join(v)})")


DEFAULT_PRICES = Prices()


def prices_from(data: object, source: str = "prices") -> Prices:
    """Prices from a parsed YAML mapping, errors naming the key."""
    if not isinstance(data, Mapping):
        raise PartsError(f"{source}: expected a mapping of part kind -> price, got {type(data).__name__}")
    try:
        return Prices.model_validate(dict(data))
    except pydantic.ValidationError as e:
        problems: dict[str, str] = {}
        for err in e.errors():
            key = str(err["loc"][0]) if err["loc"] else "(top level)"
            if err["type"] == "extra_forbidden":
                msg = f"unknown part kind (kinds: unit, {', '.join(KINDS)})"
            elif key in KINDS and err["type"] != "value_error":
                msg = "a price is a number, or a mapping of size -> number (and 'default')"
            else:
                msg = err["msg"].removeprefix("Value error, ")
            problems.setdefault(key, msg)
        raise PartsError(f"{source}: " + "; ".join(f"{k}: {m}" for k, m in problems.items())) from None


def cost(b: Bill, prices: Prices = DEFAULT_PRICES) -> dict[str, float]:
    """The bill's cost per part kind, in `prices.unit`."""
    out = {k: 0.0 for k in KINDS}
    for p in b.parts:
        out[p.kind] += p.count * prices.price(p.kind, p.size)
    return out
