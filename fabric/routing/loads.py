"""Load smoothing for a routing policy: the measured egress rate of every directed link as an
exponentially weighted moving average, with hot/cool hysteresis (`RouterConfig`), and the rates
presumed for slots that have just started sending (`LinkLoads.presume`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fabric.routing.records import DecisionPoint, DirectedLink, RouterConfig, SlotKey


@dataclass
class _Load:
    rate_bps: float = 0.0
    hot: bool = False


class LinkLoads:
    """The smoothed loads (`rates`: directed link -> `_Load`, only links with a sample) of the links
    in `capacity_bps` (bits per second; the policy's own dict). The thresholds are the policy's
    `config` of the moment, passed in."""

    def __init__(self, capacity_bps: dict[DirectedLink, float]) -> None:
        self.capacity_bps = capacity_bps
        self.rates: dict[DirectedLink, _Load] = {}

    def fold(self, port_rates_bps: dict[DirectedLink, float], cfg: RouterConfig) -> None:
        """Fold in measured egress rates (bits/s; links not in `capacity_bps` are ignored)."""
        for link, rate in port_rates_bps.items():
            cap = self.capacity_bps.get(link)
            if cap is None:
                continue
            load = self.rates.setdefault(link, _Load(rate))
            load.rate_bps += cfg.ewma_alpha * (rate - load.rate_bps)
            util = load.rate_bps / cap
            if load.hot and util < cfg.cool_util:
                load.hot = False
            elif not load.hot and util >= cfg.hot_util:
                load.hot = True

    def hot_links(self) -> tuple[DirectedLink, ...]:
        return tuple(sorted(l for l, ld in self.rates.items() if ld.hot))

    def presume(self, slot_rates_bps: dict[SlotKey, float], newcomers_bytes: dict[SlotKey, int],
                newcomers_span_s: dict[SlotKey, float] | None, hot: set[DirectedLink],
                slots: dict[DecisionPoint, tuple[int, ...]],
                slot_links: Callable[[str, str, int], tuple[DirectedLink, ...]],
                rate_bps: Callable[[DirectedLink], float], cfg: RouterConfig) -> dict[SlotKey, float]:
        """`RoutingPolicy.presume_newcomers` on the hot links `hot` (not empty), given the policy's
        slot tables `slots`, its `slot_links` and `rate_bps`, and its `cfg`.

        On a hot link the newcomers are presumed to take their fair share of the link's rate next to
        the elephants already known there, as TCP flows would (n_new / (n_known + n_new) of it), split
        between them in proportion to their rates so far: bytes over `newcomers_span_s` (the time from
        the last reading before it was first seen sending to the latest, so a flow that started
        hundreds of ms after another, bytes behind it, still counts at its own pace), or in proportion
        to their bytes where no span is given; a newcomer gets the least of its hot links'
        estimates, and never less than its own measured rate. An estimate only: the windowed rates
        replace it as soon as they cover the slot's activity, and the hold-down (`hold_s`) gives the
        port samples after a move time to confirm it before that link is relieved again."""
        share = cfg.min_move_share
        n_known: dict[DirectedLink, int] = {}
        for (sw, dest, s), rate in slot_rates_bps.items():
            if (sw, dest, s) in newcomers_bytes or (sw, dest) not in slots or s >= len(slots[(sw, dest)]):
                continue
            for link in slot_links(sw, dest, s):
                if link in hot and rate >= share * self.capacity_bps[link]:
                    n_known[link] = n_known.get(link, 0) + 1
        on_link: dict[DirectedLink, list[SlotKey]] = {}
        crossing: dict[SlotKey, list[DirectedLink]] = {}
        for key, n_bytes in newcomers_bytes.items():
            sw, dest, s = key
            if n_bytes < max(1, cfg.min_newcomer_bytes) or (sw, dest) not in slots or s >= len(slots[(sw, dest)]):
                continue
            links = [l for l in slot_links(sw, dest, s) if l in hot]
            if links:
                crossing[key] = links
                for link in links:
                    on_link.setdefault(link, []).append(key)
        if not crossing:
            return slot_rates_bps
        out = dict(slot_rates_bps)
        spans = newcomers_span_s or {}
        weight = {k: newcomers_bytes[k] / spans[k] if spans.get(k, 0.0) > 0 else float(newcomers_bytes[k])
                  for k in crossing}
        for key, links in crossing.items():
            estimates = []
            for link in links:
                new = on_link[link]
                pool = rate_bps(link) * len(new) / (n_known.get(link, 0) + len(new))
                estimates.append(pool * weight[key] / sum(weight[k] for k in new))
            out[key] = max(out.get(key, 0.0), min(estimates))
        return out
