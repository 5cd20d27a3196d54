"""Run the controller: `python -m controller --topology FILE [--mode static] [--port 6653]`.

os-ken 4 has no manager CLI, so the app is started in-process (native-thread hub).
"""
from __future__ import annotations

import argparse
import logging
import sys

from fabric.errors import FabriclabError
from fabric.routing import MODES


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller", description=__doc__)
    ap.add_argument("--topology", required=True, help="topology YAML file (the same one the emulator uses)")
    ap.add_argument("--mode", default="static", choices=MODES)
    ap.add_argument("--listen", default="127.0.0.1", help="OpenFlow listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=6653, help="OpenFlow listen port (default 6653)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    from fabric import topofile
    from controller.app import configure
    from controller.core import ControllerCore

    try:
        core = ControllerCore(topofile.load(args.topology), mode=args.mode)
    except FabriclabError as e:
        print(f"controller: {e}", file=sys.stderr)
        return 2
    configure(core)

    from os_ken import cfg
    from os_ken.base.app_manager import AppManager
    from os_ken.controller import controller as _registers_ofp_options  # noqa: F401

    cfg.CONF(
        args=[f"--ofp-listen-host={args.listen}", f"--ofp-tcp-listen-port={args.port}"],
        project="os_ken",
    )
    logging.getLogger("fabriclab.controller").info(
        "fabric %r, mode %s, listening on %s:%d", core.fabric.name, args.mode, args.listen, args.port
    )
    AppManager.run_apps(["controller.app", "os_ken.controller.ofp_handler"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
