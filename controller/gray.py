"""Gray failures: links that stay up but lose packets, found by probing every link, pure.

A gray link (a failing optic dropping a share of its frames, a link that negotiated down and drops
what it cannot carry) keeps its carrier: no port-status event comes, fast-failover buckets still
use it, and the loss shows nowhere the controller looks. So the controller measures it:

- every `period_s` each switch sends `probes` probe frames (`PROBE_ETH_TYPE`) out of each of its
  live switch-to-switch ports: one OpenFlow packet-out per poll (every 10 ms), one frame per port,
  in the period's first `burst_s` (the copies of one packet-out would leave in one batch, one
  `sendmmsg`, which stops at a frame that fails: their losses would not be independent);
- every switch counts the probes that arrive, one table-0 flow per in-port (`controller.core`);
- `settle_s` into the period the controller reads those counters and sets the probes that arrived
  against the probes sent when it asked. OVS refreshes flow counters in the userspace datapath only
  every ~0.5 s (`benchmarks/ovs_counters.py`), so the reading comes 0.75 s after the burst ends:
  read 0.35 s after it (as first built), the last probes of a burst were often not counted yet,
  and with a core busy the number missing grew from one reading to the next often enough that
  healthy links turned gray, eight at once (`benchmarks/gray_busy.py --busy-core`).

Counts are cumulative, so a probe counted late (a stalled datapath) is credited at the next reading:
a burst's loss is the growth of the link's deficit (sent minus arrived) since the reading before. A
directed link turns **gray** after `bad_bursts` lossy readings in a row (a reading is lossy when at
least `min_lost` probes and `loss` of those sent since the reading before are missing); a late count
makes one reading look lossy and the next one gain, so it cannot do that twice. A gray link is
**healed** after `clean_bursts` clean readings in a row; a link that turns gray again within
`repeat_window_s` of healing must be clean twice as long each time (up to `max_clean_bursts`), so a
link that loses packets only under load (its traffic moved away, the probes pass) does not flap.

A full link drops by design: its queue overflows (congestion), and the probes in it are lost with
the traffic, which they cannot tell from a failing optic. So a reading of a link that was **busy**
(a port sample since the reading before found it carrying at least `busy_util` of its capacity:
`note_busy`) is not judged: it ends a run of lossy readings and adds nothing to a run of clean ones.
(Read as loss, a TCP flow filling a link could get it taken out of service, and its slots moved;
`benchmarks/gray_busy.py` counts the lossy readings of a link two TCP flows keep full.) A link
that loses packets below that load is found; one that is only ever full is not, until its load
drops.

Probes are sent on gray links too (that is how they heal), never on links whose port is down.
Times are the caller's `now` (monotonic seconds).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fabric.errors import FabriclabError

DirectedLink = tuple[str, int]  # (switch, egress port)

#: the probe frame's EtherType: IEEE 802 local experimental 1
PROBE_ETH_TYPE = 0x88B5
#: locally administered unicast MAC used as both addresses of a probe frame
PROBE_MAC = "0e:fa:b1:ab:00:01"


@dataclass(frozen=True)
class GrayConfig:
    period_s: float = 1.0  # a burst of probes every this long; 0 disables probing
    probes: int = 20  # probes per link per burst
    settle_s: float = 0.95  # read the counters this long into each period ...
    burst_s: float = 0.2  # ... the burst sent in its first this long (counters refresh every ~0.5 s)
    loss: float = 0.05  # a reading is lossy when this share of the probes sent since the last one ...
    min_lost: int = 2  # ... and at least this many are missing
    bad_bursts: int = 2  # lossy readings in a row that make a link gray
    clean_bursts: int = 3  # clean readings in a row that heal it
    max_clean_bursts: int = 48
    repeat_window_s: float = 60.0  # gray again this soon after healing: twice the clean readings
    busy_util: float = 0.8  # a link that carried this share of its capacity since a reading: not judged

    def __post_init__(self) -> None:
        if self.period_s < 0:
            raise FabriclabError(f"gray probing period must be >= 0 s, got {self.period_s}")
        if self.period_s and not 0 < self.burst_s < self.settle_s < self.period_s:
            raise FabriclabError("gray probing needs 0 < burst_s < settle_s < period_s, got "
                                 f"{self.burst_s}, {self.settle_s} and {self.period_s}")
        if not 1 <= self.probes <= 200:
            raise FabriclabError(f"probes per burst must be in 1..200, got {self.probes}")
        if not 0 < self.loss < 1:
            raise FabriclabError(f"the gray loss threshold must be in (0, 1), got {self.loss}")
        if not self.busy_util > 0:
            raise FabriclabError(f"the gray busy utilisation must be > 0, got {self.busy_util}")
        if self.min_lost < 1 or self.bad_bursts < 1 or not 1 <= self.clean_bursts <= self.max_clean_bursts:
            raise FabriclabError("min_lost, bad_bursts and clean_bursts must be >= 1, clean_bursts <= max_clean_bursts")

    @property
    def enabled(self) -> bool:
        return self.period_s > 0

    def lossy(self, lost: int, sent: int) -> bool:
        """Whether a reading that missed `lost` of `sent` probes is lossy."""
        return lost >= self.min_lost and lost >= self.loss * sent


@dataclass(frozen=True)
class GrayChange:
    """A directed link turned gray (`gray` True) or healed, with the reading that decided it."""

    link: DirectedLink
    gray: bool
    lost: int  # probes missing in the deciding reading
    sent: int  # probes sent since the reading before it
    time_s: float

    def describe(self) -> str:
        what = "gray" if self.gray else "healed"
        return f"{self.link[0]}:{self.link[1]} {what}: {self.lost} of {self.sent} probes lost"


@dataclass
class _Ledger:
    sent: int = 0  # probes sent, cumulative
    rx_base: int | None = None  # the receiver's counter when this ledger started counting
    rx_last: int = 0
    eval_sent: int = 0  # `sent` at the last reading
    eval_deficit: int = 0  # sent - arrived at the last reading
    bad_run: int = 0
    clean_run: int = 0
    gray: bool = False
    clean_needed: int = 0
    healed_s: float = float("-inf")
    last: tuple[int, int] = (0, 0)  # (lost, sent) of the last reading
    busy: bool = False  # found busy by a port sample since the last reading: that reading is not judged


@dataclass
class GrayWatch:
    """The probing schedule and the per-link verdicts. `links` maps each probed directed link
    (sender switch, egress port) to its far end (receiver switch, in-port)."""

    links: dict[DirectedLink, DirectedLink]
    config: GrayConfig = field(default_factory=GrayConfig)

    def __post_init__(self) -> None:
        self._ledger = {link: _Ledger(clean_needed=self.config.clean_bursts) for link in self.links}
        self._arriving = {far: link for link, far in self.links.items()}  # (receiver, in-port) -> link
        self._ports: dict[str, tuple[int, ...]] = {}
        for sw, port in sorted(self.links):
            self._ports[sw] = self._ports.get(sw, ()) + (port,)
        self._into: dict[str, tuple[DirectedLink, ...]] = {}  # receiver -> the probed links arriving there
        for link, (sw, _) in sorted(self.links.items(), key=lambda kv: kv[1]):
            self._into[sw] = self._into.get(sw, ()) + (link,)
        self._receivers = frozenset(self._into)
        self._down: set[DirectedLink] = set()
        self._rounds: dict[str, tuple[int, int]] = {}  # switch -> (epoch, probe rounds sent in it)
        self._read_epoch: dict[str, int] = {}  # switch -> the last epoch its counters were asked for
        # switch -> the probes sent on each link arriving there when its counters were asked for
        self._sent_at_read: dict[str, dict[DirectedLink, int]] = {}

    # ---- the schedule ----------------------------------------------------------------------------
    def _epoch(self, now: float) -> int:
        return int(now // self.config.period_s)

    def burst_due(self, switch: str, now: float) -> tuple[int, ...]:
        """The ports `switch` should send a probe out of now, one each (its ports that are up), or ()
        when none is due: `probes` rounds per period, in its first `burst_s`. Call `sent` with what
        was sent."""
        if not self.config.enabled or switch not in self._ports:
            return ()
        epoch = self._epoch(now)
        done_epoch, rounds = self._rounds.get(switch, (epoch, 0))
        if done_epoch != epoch:
            rounds = 0
        if rounds >= self.config.probes or now - epoch * self.config.period_s > self.config.burst_s:
            return ()
        self._rounds[switch] = (epoch, rounds + 1)
        return tuple(p for p in self._ports[switch] if (switch, p) not in self._down)

    def sent(self, switch: str, ports: tuple[int, ...], copies: int) -> None:
        for p in ports:
            self._ledger[(switch, p)].sent += copies

    def read_due(self, switch: str, now: float) -> bool:
        """Whether to ask `switch` for its probe counters now (`settle_s` into each period, once).
        When it is, the probes sent so far on the links arriving there are the ones the answer is
        judged against (`on_counts`): probes of the next burst, sent while the answer is on its way,
        cannot have been counted in it."""
        if not self.config.enabled or switch not in self._receivers:
            return False
        epoch = self._epoch(now)
        if now - epoch * self.config.period_s < self.config.settle_s - 1e-9 or self._read_epoch.get(switch) == epoch:
            return False
        self._read_epoch[switch] = epoch
        self._sent_at_read[switch] = {link: self._ledger[link].sent for link in self._into[switch]}
        return True

    def port_state(self, link: DirectedLink, up: bool) -> None:
        """A probed port's carrier: no probes are sent out of a port that is down."""
        if link in self._ledger:
            (self._down.discard if up else self._down.add)(link)

    # ---- the readings ----------------------------------------------------------------------------
    def note_busy(self, links: Iterable[DirectedLink]) -> None:
        """Links a port sample found carrying at least `busy_util` of their capacity: their next
        reading is not judged (their queue may have dropped the probes; see the module's text)."""
        for link in links:
            led = self._ledger.get(link)
            if led is not None:
                led.busy = True

    def on_counts(self, switch: str, counts: dict[int, int], now: float) -> list[GrayChange]:
        """`switch`'s probe counters (in-port -> probes arrived, cumulative). Returns the links
        that turned gray or healed."""
        cfg = self.config
        out: list[GrayChange] = []
        asked = self._sent_at_read.pop(switch, {})
        for in_port, total in sorted(counts.items()):
            link = self._arriving.get((switch, in_port))
            if link is None:
                continue
            led = self._ledger[link]
            sent = asked.get(link, led.sent)  # (what was sent when the counters were asked for)
            if led.rx_base is None or total < led.rx_last:
                # first reading, or the counting flow was re-installed: start the ledger here
                led.rx_base, led.rx_last, led.eval_sent, led.eval_deficit = total, total, sent, 0
                continue
            led.rx_last = total
            new_sent = sent - led.eval_sent
            if new_sent <= 0:
                continue
            deficit = sent - (total - led.rx_base)
            lost = deficit - led.eval_deficit
            led.eval_sent, led.eval_deficit = sent, deficit
            led.last = (max(lost, 0), new_sent)
            bad = cfg.lossy(lost, new_sent)
            if led.busy:
                led.busy = False
                if not led.gray:
                    led.bad_run = 0  # congestion, not a failing link: the run of lossy readings ends
            elif not led.gray:
                led.bad_run = led.bad_run + 1 if bad else 0
                if led.bad_run >= cfg.bad_bursts:
                    led.gray, led.bad_run, led.clean_run = True, 0, 0
                    repeat = now - led.healed_s <= cfg.repeat_window_s
                    led.clean_needed = min(2 * led.clean_needed, cfg.max_clean_bursts) if repeat else cfg.clean_bursts
                    out.append(GrayChange(link, True, lost, new_sent, now))
            else:
                led.clean_run = 0 if bad else led.clean_run + 1
                if led.clean_run >= led.clean_needed:
                    led.gray, led.clean_run, led.healed_s = False, 0, now
                    out.append(GrayChange(link, False, max(lost, 0), new_sent, now))
        return out

    # ---- read-only -------------------------------------------------------------------------------
    def is_gray(self, link: DirectedLink) -> bool:
        led = self._ledger.get(link)
        return bool(led and led.gray)

    def gray_links(self) -> tuple[DirectedLink, ...]:
        return tuple(sorted(l for l, led in self._ledger.items() if led.gray))

    def last_reading(self, link: DirectedLink) -> tuple[int, int]:
        """(probes lost, probes sent) in `link`'s last reading."""
        return self._ledger[link].last

    def probed_ports(self, switch: str) -> tuple[int, ...]:
        return self._ports.get(switch, ())

    def counting_ports(self, switch: str) -> tuple[int, ...]:
        """The in-ports of `switch` where probes arrive (one counting flow each)."""
        return tuple(self.links[link][1] for link in self._into.get(switch, ()))  # (in-port order)
