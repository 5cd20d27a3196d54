"""The routing core (pure): path tables, the entropy plan, and the routing modes' decisions.

Read by the controller (which turns decisions into OpenFlow) and the simulator (which applies them
directly); no I/O here.
"""
from __future__ import annotations

from fabric.routing.entropy import EntropyPlan, plan_entropy
from fabric.routing.router import MODES, Router, RouterConfig, SlotMove, check_mode, static_port
from fabric.routing.tables import PairStats, PathTable

__all__ = [
    "MODES",
    "EntropyPlan",
    "PairStats",
    "PathTable",
    "Router",
    "RouterConfig",
    "SlotMove",
    "check_mode",
    "plan_entropy",
    "static_port",
]
