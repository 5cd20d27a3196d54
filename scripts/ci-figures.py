#!/usr/bin/env python3
"""Print the figures one CI run recorded (results/test-figures.jsonl): probe loss, iperf, replay, calibration.

    python3 scripts/ci-figures.py /tmp/ci/run3        # a folder holding test-figures.jsonl, or the file
"""
import json
import sys
from pathlib import Path


def main(arg: str) -> None:
    path = Path(arg)
    if path.is_dir():
        path = path / "test-figures.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    probes = [r for r in rows if "background_lost" in r]
    if probes:
        print(f"probes: {len(probes)}; background loss {[r['background_lost'] for r in probes]}; "
              f"in windows {[r['in_windows'] for r in probes]}; "
              f"packets {min(r['packets'] for r in probes)}-{max(r['packets'] for r in probes)}; "
              f"sender late max {max(r['late_max_ms'] for r in probes)} ms")
    for r in rows:
        if r["test"].startswith("iperf"):
            print(f"{r['test']}: steady {r.get('steady_mbps')} Mbit/s "
                  + ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("test", "time", "steady_mbps")))
        elif "background_lost" not in r:
            print(r["test"] + ": " + ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("test", "time")))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
