"""scripts/setup.sh's control flow, run with stand-ins for the system commands it calls (nothing is
installed or started): the set-up that .ci/run and both README commands begin with must get through
every state Open vSwitch can be found in."""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.unit


def _stand_in(bindir: Path, name: str, body: str) -> None:
    path = bindir / name
    path.write_text(f'#!/bin/sh\necho "{name} $*" >> "$CALLS"\n{body}\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run_setup(tmp_path: Path, ss_output: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """setup.sh on a host where every package is installed, the openvswitch module is missing and
    ovsdb-server and ovs-vswitchd already answer; `ss` prints `ss_output`."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (tmp_path / "ss.out").write_text(ss_output)
    _stand_in(bindir, "id", "echo 0")
    _stand_in(bindir, "dpkg-query", "printf 'install ok installed'")
    _stand_in(bindir, "modprobe", "exit 1")
    _stand_in(bindir, "mkdir", "exit 0")
    _stand_in(bindir, "sysctl", "exit 0")
    _stand_in(bindir, "systemctl", "exit 0")
    _stand_in(bindir, "ss", f'cat "{tmp_path / "ss.out"}"')
    _stand_in(bindir, "ovs-appctl", "exit 0")
    _stand_in(bindir, "ovs-vsctl", "exit 0")
    _stand_in(bindir, "ovs-vswitchd", "echo 'ovs-vswitchd (Open vSwitch) 3.1.0'")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    _stand_in(venv / "bin", "python", "exit 0")
    _stand_in(venv / "bin", "pip", "exit 0")
    calls = tmp_path / "calls"
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", CALLS=str(calls), FABRICLAB_VENV=str(venv))
    res = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, capture_output=True,
                         text=True, timeout=60)
    return res, calls.read_text().splitlines() if calls.exists() else []


def test_setup_goes_on_when_ovs_vswitchd_runs_without_a_packet_socket(tmp_path):
    # A daemon that has not yet sent on a netdev port holds no AF_PACKET socket: `ss` lists nothing of
    # it. Before the fix, the empty grep ended the script with status 1 and no message.
    res, calls = _run_setup(tmp_path, "Netid State Recv-Q Send-Q Local Address:Port Peer Address:PortProcess\n")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[setup] ready:" in res.stdout
    assert "ovs-appctl -t ovs-vswitchd exit" not in calls  # nothing to restart
    assert any(c.startswith("pip install") for c in calls)


def test_setup_reads_the_send_buffer_of_a_running_daemon(tmp_path):
    # A 4 MB send buffer is what the set-up asks for: no restart, the script goes on to the venv.
    # One line per socket, as `ss` prints into a pipe (measured with a netdev bridge and one veth port).
    ss = ('p_raw UNCONN 0 0 *:vethx * users:(("ovs-vswitchd",pid=42,fd=30)) '
          'skmem:(r0,rb212992,t0,tb4194304,f0,w0,o176,bl0,d0)\n')
    res, calls = _run_setup(tmp_path, ss)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ovs-appctl -t ovs-vswitchd exit" not in calls
    assert "[setup] ready:" in res.stdout
