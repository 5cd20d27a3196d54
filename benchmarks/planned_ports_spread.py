"""How evenly planned source ports spread traffic patterns over a fabric's links, rule against rule (no root).

    .venv/bin/python benchmarks/planned_ports_spread.py [--topology T ...] [--channels 2] [--rule R ...]
                                                        [--sweep] [--no-rates]

For each fabric and pattern, the connections `fabriclab` plans (`fabric.flowsim.connections`: every pair
`--channels` connections per plane), with the source ports of each candidate rule, walked on the adaptive
policy's data plane under default weights (`fabric.flowsim.routes.LinkRoutes`). A rule is a count
w = channels x f(src, dst) + channel over the hosts' places in edge-switch order (`fabric.analysis.edge_order`),
read as the tiers' slots as `pair_sport` reads it (`fabric.flowsim.connections.sports_of_counts`):
- `sum`: f = src + dst (the rule before 2026-12-06);
- `local`: f = the hosts' places within their edge switches, summed;
- `src+2dst`: f = src + 2 dst;
- `dst-twist`: f = src + dst + the twist of the destination;
- `twist`: f = src + dst + the twist of the source: `fabric.routing.entropy.pair_sport`, the rule in use
  (its ports are the library's own, not recomputed here).
The twist (`fabric.routing.entropy.source_twist`) is 1 where the host's block numbers at the sizes where the
tiers' next hops turn over (`twist_blocks`) have an odd sum.

Patterns, on host indexes (rank r on host r), G = GPUs per server (4 where the fabric has no servers):
`shift +k` every host sends to host + k (mod hosts): +1 a ring, +G a ring across servers (a data-parallel
ring, server-wired), +4G a pipeline's next stage (the GPT-3 preset's PP pairs at 1,024 GPUs), -4G its
backward pass, +hosts/2; `one-to-many` host 0 to every other; `many-to-one` every other to host 0;
`all-to-all` every pair. Metrics, per rule, as `up/down rate`:
- up: the worst switch's most loaded uplink (towards a higher tier) in flows, over its even share
  (ceil(flows on its uplinks / its uplinks)); down: the same over the downlinks into each switch;
  1.00 is as even as whole flows allow;
- rate: the worst host pair's max-min fair rate (`fabric.flowsim.maxmin.max_min_rates_on_paths`, the sum
  of its connections' rates) over its rate with the switch-to-switch links unlimited (what its NICs
  allow); not computed for the all-to-all (its pairs share their NICs 1,023 ways).
`--sweep` replaces the patterns by every shift (a sample of 272 at 1,024 hosts) and prints, per rule, how
many shifts it spreads worse or better than `sum`, in flows and in the worst pair's rate.

A plan that places a leaf's pairs against each other greedily (the replay and the simulator know a job's
pairs in advance) is not a candidate: a pair's ports would then depend on which other pairs were planned
with it, where `pair_sport` is a function of the pair alone, the same for the emulator's agents, the
simulator and the controller's tools.
"""
from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FABRICS = ("dual-plane-16", "dual-plane-16-servers", "dual-plane-1024", "dual-plane-1024-servers",
           "dual-plane-1024-rail", "pyramid-16", "pyramid-1024-rail", "pyramid-1024-servers", "leaf-spine-16")
RULES = ("sum", "local", "src+2dst", "dst-twist", "twist")
#: a count's f from (src, dst, src within its edge switch, dst within its edge switch, twist of src, of dst)
COUNTS: dict[str, Callable[..., Any]] = {
    "sum": lambda s, d, sl, dl, ts, td: s + d,
    "local": lambda s, d, sl, dl, ts, td: sl + dl,
    "src+2dst": lambda s, d, sl, dl, ts, td: s + 2 * d,
    "dst-twist": lambda s, d, sl, dl, ts, td: s + d + td,
}


def patterns(n: int, gpus_per_server: int, sweep: bool) -> dict[str, tuple[Any, Any]]:
    """name -> (senders, receivers), host indexes."""
    idx = np.arange(n)
    if sweep:
        ks = list(range(1, n)) if n <= 64 else sorted(set(range(1, 80)) | set(range(32, n, 32))
                                                      | {n - k for k in range(1, 40)} | set(range(80, n, 7)))
        return {f"shift +{k}": (idx, (idx + k) % n) for k in ks}
    g = gpus_per_server if gpus_per_server > 1 else 4
    pipe = 4 * g if 4 * g < n else 2 * g
    out = {f"shift {k:+d}": (idx, (idx + k) % n) for k in dict.fromkeys((1, g, pipe, -pipe, n // 2))}
    out["one-to-many"] = (np.zeros(n - 1, dtype=np.int64), idx[1:])
    out["many-to-one"] = (idx[1:], np.zeros(n - 1, dtype=np.int64))
    a, b = np.meshgrid(idx, idx, indexing="ij")
    out["all-to-all"] = (a[a != b], b[a != b])
    return out


class Bench:
    """One fabric: its policy, links and the hosts' places, and the metrics of a rule on a pattern."""

    def __init__(self, name: str, channels: int) -> None:
        from fabric import topofile
        from fabric.analysis import edge_order
        from fabric.flowsim.inputs import directed_links
        from fabric.flowsim.routes import LinkRoutes
        from fabric.model import ROLE_TIER
        from fabric.routing import PathTable, load_policy
        from fabric.routing.entropy import twist_blocks

        self.fab = fab = topofile.load(name)
        self.channels = channels
        self.policy = load_policy("adaptive")(PathTable(fab))
        order = edge_order(fab)
        place = {h: i for i, h in enumerate(order)}
        first = {h.name: fab.nics_of[h.name][0].switch for h in fab.hosts}
        start: dict[str, int] = {}
        for i, h in enumerate(order):
            start.setdefault(first[h], i)
        self.index = np.asarray([place[h.name] for h in fab.hosts], dtype=np.int64)
        self.local = np.asarray([place[h.name] - start[first[h.name]] for h in fab.hosts], dtype=np.int64)
        blocks = twist_blocks(self.policy.entropy, channels)
        self.twist = sum((self.index // b for b in blocks), np.zeros_like(self.index)) % 2
        self.links, self.capacity_bps = directed_links(fab)
        self.routes = LinkRoutes(fab, self.policy, self.links)
        tier = {s.name: ROLE_TIER[s.role] for s in fab.switches}
        self.up: dict[str, list[int]] = {}
        self.down: dict[str, list[int]] = {}
        for i, (a, b) in enumerate(self.links):
            if a in tier and b in tier:
                (self.up.setdefault(a, []) if tier[a] < tier[b] else self.down.setdefault(b, [])).append(i)
        inner = np.asarray([a in tier and b in tier for a, b in self.links])
        self.unlimited_bps = np.where(inner, 1e18, self.capacity_bps)

    def run(self, senders: Any, receivers: Any, rules: list[str], rates: bool) -> dict[str, tuple[float, float, float]]:
        """rule -> (up, down, rate) on the pairs (senders[i], receivers[i]) (module docstring)."""
        from fabric.flowsim.connections import pair_key, plan_connection_table, sports_of_counts
        from fabric.flowsim.maxmin import max_min_rates_on_paths

        n = len(self.fab.hosts)
        keys = pair_key(n, senders, receivers)
        ct = plan_connection_table(self.fab, self.policy.entropy, keys, channels=self.channels, ports="planned")
        snd, rcv = ct.pair_hosts
        pair = ct.pair_of_connection
        s, d = snd[pair], rcv[pair]
        out: dict[str, tuple[float, float, float]] = {}
        ideal = None
        for rule in rules:
            if rule == "twist":
                sport = ct.sport
            else:
                f = COUNTS[rule](self.index[s], self.index[d], self.local[s], self.local[d], self.twist[s],
                                 self.twist[d])
                sport = sports_of_counts(self.policy.entropy, self.channels * f + ct.channel)
            rows, _ = self.routes.rows(ct.src_nic, ct.dst_nic, sport)
            flows = np.bincount(rows[rows >= 0], minlength=len(self.links))
            spread = [max((flows[g].max() / math.ceil(flows[g].sum() / len(g)) for g in groups.values()
                           if flows[g].sum()), default=1.0) for groups in (self.up, self.down)]
            rate = math.nan
            if rates:
                conn_bps, _ = max_min_rates_on_paths(rows, self.capacity_bps)
                if ideal is None:
                    free_bps, _ = max_min_rates_on_paths(rows, self.unlimited_bps)
                    ideal = np.bincount(pair, weights=free_bps, minlength=keys.size)
                rate = float((np.bincount(pair, weights=conn_bps, minlength=keys.size) / ideal).min())
            out[rule] = (float(spread[0]), float(spread[1]), rate)
        return out


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", nargs="+", default=list(FABRICS))
    ap.add_argument("--channels", type=int, default=2, help="connections per pair and plane (default 2)")
    ap.add_argument("--rule", nargs="+", choices=RULES, default=list(RULES))
    ap.add_argument("--sweep", action="store_true", help="every shift (sampled at 1,024 hosts), summarised")
    ap.add_argument("--no-rates", action="store_true", help="flows per link only (no max-min rates)")
    args = ap.parse_args(argv)
    rules = list(dict.fromkeys(["sum", *args.rule]))  # the rule before is the baseline of every comparison
    console = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("fabrics", total=len(args.topology))
        for name in args.topology:
            bar.update(task, description=f"{name}: building")
            bench = Bench(name, args.channels)
            pats = patterns(len(bench.fab.hosts), bench.fab.gpus_per_server, args.sweep)
            sub = bar.add_task(name, total=len(pats))
            res: dict[str, dict[str, tuple[float, float, float]]] = {}
            for pname, (s, d) in pats.items():
                bar.update(sub, description=f"{name}: {pname}")
                res[pname] = bench.run(s, d, rules, not args.no_rates and pname != "all-to-all")
                bar.advance(sub)
            bar.remove_task(sub)
            bar.advance(task)
            print(f"\n{name}, {args.channels} channel(s) per pair and plane:\n")
            if args.sweep:
                print_sweep(res, rules)
            else:
                print("| pattern | " + " | ".join(rules) + " |\n|---|" + "---|" * len(rules))
                for pname, by_rule in res.items():
                    print(f"| {pname} | " + " | ".join(cell(*by_rule[r]) for r in rules) + " |")
            sys.stdout.flush()
    return 0


def cell(up: float, down: float, rate: float) -> str:
    return f"{up:.2f}/{down:.2f}" + ("" if math.isnan(rate) else f" {rate:.2f}")


def print_sweep(res: dict[str, dict[str, tuple[float, float, float]]], rules: list[str]) -> None:
    print(f"| rule ({len(res)} shifts) | mean up/down | flows worse than sum | mean rate | min rate "
          "| rate worse than sum | rate better |\n|---|---|---|---|---|---|---|")
    base = {p: r["sum"] for p, r in res.items()}
    for rule in rules:
        got = {p: r[rule] for p, r in res.items()}
        worse = [p for p in got if max(got[p][:2]) > max(base[p][:2]) + 1e-9]
        slower = [p for p in got if got[p][2] < base[p][2] - 1e-9]
        faster = [p for p in got if got[p][2] > base[p][2] + 1e-9]
        rates = [v[2] for v in got.values()]
        print(f"| {rule} | {np.mean([max(v[:2]) for v in got.values()]):.2f} | {len(worse)} {short(worse)} "
              f"| {np.mean(rates):.3f} | {min(rates):.2f} | {len(slower)} {short(slower)} | {len(faster)} |")


def short(names: list[str]) -> str:
    return "(" + ", ".join(n.removeprefix("shift ") for n in names[:3]) + (", ...)" if len(names) > 3 else ")") \
        if names else ""


if __name__ == "__main__":
    raise SystemExit(main())
