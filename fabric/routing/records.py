"""The routing policy's value types: its configuration, its decisions (slot moves, and the routing
events that hold them) and its view of one directed link. Re-exported by `fabric.routing.policy`
and `fabric.routing`."""
from __future__ import annotations

from dataclasses import dataclass

from fabric.errors import RoutingError

DirectedLink = tuple[str, int]  # (switch, egress port)
DecisionPoint = tuple[str, str]  # (switch, destination edge switch)
SlotKey = tuple[str, str, int]  # (switch, destination edge switch, slot)

CAUSES = ("failure", "recovery", "congestion", "manual")


@dataclass(frozen=True)
class RouterConfig:
    hot_util: float = 0.9  # a link becomes hot at this utilisation ...
    cool_util: float = 0.7  # ... and stops being hot below this (hysteresis)
    hold_s: float = 0.2  # after a congestion move, leave that decision point and that hot link alone this long
    ewma_alpha: float = 0.5  # weight of the newest rate sample
    min_move_share: float = 0.05  # slots below this share of a link are mice: not counted, not moved
    # a slot that just started is presumed an elephant only once it has sent this much (ten full-size
    # packets): a connection's first packets (a control connection's handshake) are not an elephant
    min_newcomer_bytes: int = 15000

    def __post_init__(self) -> None:
        if not 0 < self.cool_util < self.hot_util:
            raise RoutingError(f"need 0 < cool_util < hot_util, got {self.cool_util}, {self.hot_util}")
        if not 0 < self.ewma_alpha <= 1:
            raise RoutingError(f"ewma_alpha must be in (0, 1], got {self.ewma_alpha}")
        if self.hold_s < 0:
            raise RoutingError(f"hold_s must be >= 0, got {self.hold_s}")
        if not 0 <= self.min_move_share < 1:
            raise RoutingError(f"min_move_share must be in [0, 1), got {self.min_move_share}")
        if self.min_newcomer_bytes < 0:
            raise RoutingError(f"min_newcomer_bytes must be >= 0, got {self.min_newcomer_bytes}")


@dataclass(frozen=True, slots=True)
class SlotMove:
    switch: str
    dest: str  # destination edge switch
    slot: int
    old_port: int
    new_port: int
    cause: str  # one of CAUSES


@dataclass(frozen=True)
class RouteEvent:
    """One decision: what triggered it, when (`now` as given, seconds), and every slot it moved."""

    time_s: float
    cause: str
    trigger: str  # e.g. "spineA0:4 down", "leafA0:1 hot", "operator"
    moves: tuple[SlotMove, ...]
    decision_us: float  # the policy's own decision time


@dataclass(frozen=True)
class LinkState:
    """A directed link (a switch's egress port) as the policy sees it."""

    switch: str
    port: int
    peer: str
    peer_port: int
    up: bool
    capacity_bps: float
    rate_bps: float  # smoothed egress rate, bits per second
    utilisation: float
    hot: bool
