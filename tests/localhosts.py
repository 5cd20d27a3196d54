"""A `fabric.emulation.hosts.Hosts` for tests without root: every host is this machine, every process
local (the traffic tools then talk over loopback)."""
from __future__ import annotations

import subprocess


class LocalHosts:
    def __init__(self, fabric):
        self.fabric = fabric

    def popen(self, host, args, **kwargs):
        kwargs.setdefault("stdout", subprocess.DEVNULL)
        kwargs.setdefault("stderr", subprocess.DEVNULL)
        return subprocess.Popen(args, **kwargs)

    def run(self, host, args, timeout_s=30.0):
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
