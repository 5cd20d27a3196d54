"""Run the controller: `python -m controller --topology FILE [--routing adaptive] [--port 6653] [--rest-port 8080]`.

os-ken 4 has no manager CLI, so the app is started in-process (native-thread hub). `--routing` takes
a built-in mode (static, ecmp, adaptive) or a policy class of your own, `package.module:ClassName`
(a subclass of fabric.routing.RoutingPolicy), importable by this process.
"""
from __future__ import annotations

import argparse
import gc
import logging
import sys
import time

from fabric.errors import FabriclabError
from fabric.routing import MODES


def tune_gc() -> None:
    """Keep Python's cycle collector out of the decision path: the model, path tables and cached
    intents live as long as the process, so freeze what exists and collect the old generation
    rarely (full collections over them cost tens of ms at 1024 hosts, measured as p99 spikes)."""
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m controller", description=__doc__)
    ap.add_argument("--topology", required=True, help="topology YAML file (the same one the emulator uses)")
    ap.add_argument("--routing", default="adaptive",
                    help=f"routing policy: {', '.join(MODES)} or package.module:ClassName (default adaptive)")
    ap.add_argument("--listen", default="127.0.0.1", help="OpenFlow listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=6653, help="OpenFlow listen port (default 6653)")
    ap.add_argument("--unix", default="", metavar="PATH",
                    help="also accept switches on this Unix socket (switches in other network namespaces, as "
                         "the emulation runs them; OVS target unix:PATH)")
    ap.add_argument("--rest-host", default="127.0.0.1", help="REST/metrics listen address (default 127.0.0.1)")
    ap.add_argument("--rest-port", type=int, default=8080, help="REST/metrics port; 0 disables (default 8080)")
    ap.add_argument("--poll-ms", type=float, default=10.0, help="port-statistics polling interval (default 10)")
    ap.add_argument("--flow-poll-ms", type=float, default=1000.0,
                    help="background ECMP flow-statistics interval (default 1000)")
    ap.add_argument("--hot-flow-poll-ms", type=float, default=250.0,
                    help="flow-statistics interval at decision points upstream of a hot link (default 250)")
    ap.add_argument("--fast-flow-ms", type=float, default=1000.0,
                    help="after a link turns hot, ask the decision points that could relieve it for flow "
                         "statistics every --fast-flow-poll-ms for this long (default 1000: OVS refreshes userspace flow "
                         "counters every ~500 ms, and the first reply may not show flows that just started); 0 disables")
    ap.add_argument("--fast-flow-poll-ms", type=float, default=20.0,
                    help="the interval of those fast flow-statistics requests (default 20; as long as "
                         "--stats-nudge-ms, each goes with the nudge for the next)")
    ap.add_argument("--stats-nudge-ms", type=float, default=20.0,
                    help="send those fast flow-statistics requests this long after a flow-table change that "
                         "makes OVS refresh its flow counters at once (re-adding a flow no packet reaches); "
                         "0: ask at once, on counters up to ~500 ms old (default 20)")
    ap.add_argument("--warm-nudge", action=argparse.BooleanOptionalAction, default=True,
                    help="nudge the decision points that could relieve a link as soon as it turns warm (at "
                         "--cool-util), so that when it turns hot their flow-statistics request needs no "
                         "further wait (default: on)")
    ap.add_argument("--flow-window-ms", type=float, default=1000.0,
                    help="shortest span for per-slot rates from flow counters (default 1000: OVS refreshes "
                         "userspace flow counters only every few hundred ms)")
    ap.add_argument("--port-window-ms", type=float, default=20.0,
                    help="shortest span for port rates (default 20: two polls, so one stall of the "
                         "userspace datapath does not read as an idle or a bursting link)")
    ap.add_argument("--hot-util", type=float, default=0.9, help="utilisation at which a link turns hot")
    ap.add_argument("--cool-util", type=float, default=0.7, help="utilisation below which it cools again")
    ap.add_argument("--hold-ms", type=float, default=200.0, help="hold-down after a congestion move")
    ap.add_argument("--mbps-per-gbps", type=float, default=0.1,
                    help="emulated Mbit/s per model Gbit/s, for link capacities (default 0.1; 1000 = real rates)")
    ap.add_argument("--precompute-s", type=float, default=10.0,
                    help="at start, prepare the reaction to every single link failure for at most this "
                         "long, so those decisions are lookups; 0: none (default 10; a 16-host fabric "
                         "takes milliseconds)")
    ap.add_argument("--gray-period-ms", type=float, default=1000.0,
                    help="gray-failure probing: a burst of probes on every switch-to-switch link this often; "
                         "0 disables (default 1000)")
    ap.add_argument("--gray-loss", type=float, default=0.05,
                    help="share of a burst's probes lost that counts against a link; two such bursts in a row "
                         "make it gray, and a reacting routing takes it out of service (default 0.05)")
    ap.add_argument("--gray-busy-util", type=float, default=0.8,
                    help="a link a port sample finds carrying this share of its capacity is busy: probes lost "
                         "then are its queue's (congestion), and that burst is not judged (default 0.8)")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if min(args.poll_ms, args.flow_poll_ms, args.hot_flow_poll_ms, args.mbps_per_gbps) <= 0:
        ap.error("--poll-ms, --flow-poll-ms, --hot-flow-poll-ms and --mbps-per-gbps must be > 0")
    if args.port_window_ms < 0:
        ap.error("--port-window-ms must be >= 0")
    if args.fast_flow_ms < 0 or args.stats_nudge_ms < 0:
        ap.error("--fast-flow-ms and --stats-nudge-ms must be >= 0")
    if args.fast_flow_poll_ms <= 0:
        ap.error("--fast-flow-poll-ms must be > 0")
    if args.precompute_s < 0:
        ap.error("--precompute-s must be >= 0")

    from controller.app import AppConfig, configure
    from controller.core import ControllerCore
    from controller.gray import GrayConfig
    from controller.sync import PollConfig
    from fabric import topofile
    from fabric.routing import RouterConfig

    try:
        gray_period_s = args.gray_period_ms / 1000
        gray_scale = min(1.0, gray_period_s / GrayConfig.period_s)
        core = ControllerCore(
            topofile.load(args.topology),
            args.routing,
            RouterConfig(hot_util=args.hot_util, cool_util=args.cool_util, hold_s=args.hold_ms / 1000),
            rate_scale=args.mbps_per_gbps * 1e6 / 1e9,
            flow_window_s=args.flow_window_ms / 1000,
            port_window_s=args.port_window_ms / 1000,
            warm_nudge=args.warm_nudge,
            gray=GrayConfig(period_s=gray_period_s, loss=args.gray_loss, busy_util=args.gray_busy_util,
                            # the default schedule within a period, squeezed into a shorter one
                            settle_s=GrayConfig.settle_s * gray_scale, burst_s=GrayConfig.burst_s * gray_scale),
        )
    except FabriclabError as e:
        print(f"controller: {e}", file=sys.stderr)
        return 2
    if args.precompute_s > 0:
        started = time.perf_counter()
        n = core.precompute_failures(budget_s=args.precompute_s)
        logging.getLogger("fabriclab.controller").info(
            "prepared the reaction to %d link failures in %.2f s", n, time.perf_counter() - started)
    tune_gc()  # after precomputing: what it made is frozen too
    configure(AppConfig(core, PollConfig(poll_s=args.poll_ms / 1000, flow_poll_s=args.flow_poll_ms / 1000,
                                         hot_flow_poll_s=args.hot_flow_poll_ms / 1000,
                                         urgent_flow_poll_s=args.fast_flow_poll_ms / 1000,
                                         fast_flow_s=args.fast_flow_ms / 1000,
                                         nudge_lead_s=args.stats_nudge_ms / 1000),
                        rest_host=args.rest_host, rest_port=args.rest_port, openflow_unix=args.unix))

    from os_ken import cfg
    from os_ken.base.app_manager import AppManager
    from os_ken.controller import controller as _registers_ofp_options  # noqa: F401

    cfg.CONF(
        args=[f"--ofp-listen-host={args.listen}", f"--ofp-tcp-listen-port={args.port}"],
        project="os_ken",
    )
    logging.getLogger("fabriclab.controller").info(
        "fabric %r, routing %s, OpenFlow on %s:%d, REST on %s:%d", core.fabric.name, core.routing, args.listen,
        args.port, args.rest_host, args.rest_port,
    )
    AppManager.run_apps(["controller.app", "os_ken.controller.ofp_handler"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
