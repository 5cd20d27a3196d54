"""The paced UDP probe: lost-span arithmetic by hand, and a real run over loopback."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from controller.process import free_port
from traffic.probe import summarise


def test_lost_spans_by_hand():
    seen = bytearray([1, 1, 1, 0, 0, 0, 1, 1, 1, 0])
    res = summarise(seen, expected=10, duplicates=0)
    assert res.lost_spans == [(3, 5), (9, 9)]
    assert (res.received, res.lost, res.longest_span) == (6, 4, 3)
    # packets never seen at the end, when the sender said it sent 12
    assert summarise(seen, expected=12, duplicates=0).lost_spans == [(3, 5), (9, 11)]


def test_probe_over_loopback_counts_every_packet():
    port = free_port()
    recv = subprocess.Popen([sys.executable, "-m", "traffic.probe", "recv", "--bind", "127.0.0.1",
                             "--port", str(port), "--idle-s", "2"], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        sent = subprocess.run([sys.executable, "-m", "traffic.probe", "send", "--dst", "127.0.0.1",
                               "--port", str(port), "--sport", str(free_port()), "--rate", "2000",
                               "--seconds", "1"], capture_output=True, text=True, check=True, timeout=30)
        out, _ = recv.communicate(timeout=30)
    finally:
        if recv.poll() is None:
            recv.kill()
    assert json.loads(sent.stdout)["sent"] == 2000
    res = json.loads(out)
    assert res["expected"] == 2000 and res["received"] == 2000 and res["lost_spans"] == []
