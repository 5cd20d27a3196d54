"""The small interface the host-side traffic tools need from an emulation: run this in host h.

`fabric.emulation.net.Emulation` implements it with Mininet; anything else that can start a process
in a host's network namespace can too (the traffic tools in `traffic/` only use this).
"""
from __future__ import annotations

import subprocess
from typing import Any, Protocol

from fabric.model import Fabric


class Hosts(Protocol):
    fabric: Fabric

    def popen(self, host: str, args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `args` inside `host`'s network namespace (no shell). The caller owns the process
        and ends it by its handle; stdout/stderr default to DEVNULL unless given."""
        ...

    def run(self, host: str, args: list[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run `args` inside `host` to completion and return its output (text)."""
        ...
