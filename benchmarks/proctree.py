"""CPU time and peak memory of a benchmark's child process and all its descendants, from /proc (no root).

A command that runs on a local Ray instance does its work in Ray's worker processes: they are the instance's
children, not processes the command waits for, so `resource.getrusage(RUSAGE_CHILDREN)` misses them.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import psutil


class TreeSampler(threading.Thread):
    """Every `every_s`, the CPU time (utime + stime) and peak RSS (VmHWM) of a process and all its
    descendants, read from /proc: the plan's Ray workers are the local Ray instance's children, not
    processes the plan waits for, so the kernel's accounting of waited-for children misses them. A
    process's last interval before it exits is missed (a sampled lower bound)."""

    def __init__(self, root: int, every_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s = root, every_s
        self.cpu_s: dict[int, float] = {}
        self.hwm_mb: dict[int, float] = {}
        self.stop = threading.Event()

    def _descendants(self) -> list[int]:
        try:
            root = psutil.Process(self.root)
            return [self.root] + [c.pid for c in root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for pid in self._descendants():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            self.cpu_s[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            hwm = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), "0")
            self.hwm_mb[pid] = max(self.hwm_mb.get(pid, 0.0), int(hwm) / 1024)

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.sample()
