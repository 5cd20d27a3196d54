"""The controller process: dies loudly on a handler exception; refuses bad input clearly."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_unhandled_exception_in_a_handler_stops_the_process_with_code_70():
    code = textwrap.dedent("""
        import logging, sys
        logging.basicConfig(stream=sys.stderr)
        from controller.app import kill_on_exception

        @kill_on_exception
        def handler(ev):
            raise KeyError("boom")

        handler(None)
        print("still running")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 70
    assert "still running" not in res.stdout
    assert "unhandled exception in handler" in res.stderr and "KeyError: 'boom'" in res.stderr


def test_bad_topology_is_refused_before_listening(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbuilder: pyramid\nparams: {hosts: 15}\n")
    res = subprocess.run([sys.executable, "-m", "controller", "--topology", str(bad), "--rest-port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "hosts (15) must be a multiple of hosts_per_tor (4)" in res.stderr
