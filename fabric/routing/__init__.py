"""The routing core (pure): path tables, the entropy plan, and the routing policies' decisions.

Read by the controller (which turns decisions into OpenFlow) and the simulator (which applies them
directly); no I/O here. `load_policy` gives a built-in mode or a researcher's own policy class.
"""
from __future__ import annotations

from fabric.routing.entropy import EntropyPlan, plan_entropy
from fabric.routing.modes import BUILTIN, AdaptivePolicy, EcmpPolicy, StaticPolicy
from fabric.routing.policy import (
    DirectedLink,
    LinkState,
    RouteEvent,
    RouterConfig,
    RoutingPolicy,
    SlotMove,
)
from fabric.routing.registry import load_policy
from fabric.routing.tables import PairStats, PathTable

MODES = tuple(BUILTIN)

__all__ = [
    "BUILTIN",
    "MODES",
    "AdaptivePolicy",
    "DirectedLink",
    "EcmpPolicy",
    "EntropyPlan",
    "LinkState",
    "PairStats",
    "PathTable",
    "RouteEvent",
    "RouterConfig",
    "RoutingPolicy",
    "SlotMove",
    "StaticPolicy",
    "load_policy",
    "plan_entropy",
]
