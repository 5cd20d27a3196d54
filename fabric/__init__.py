"""fabriclab's fabric package: the topology model, routing core, emulation and simulation backends."""
from __future__ import annotations

from fabric.errors import FabriclabError, TopologyError, UnsupportedError
from fabric.model import Endpoint, Fabric, Host, Link, NicPort, Plane, Switch

__all__ = [
    "Endpoint",
    "Fabric",
    "FabriclabError",
    "Host",
    "Link",
    "NicPort",
    "Plane",
    "Switch",
    "TopologyError",
    "UnsupportedError",
]
