"""Gray failures: the probe ledger worked by hand (`controller.gray`), the probes on the fake OpenFlow
pipeline (bursts out, counting flows in, a lossy link found, taken out of service and brought back),
and the emulator's fault commands (`fabric.emulation.plan`, `faults`)."""
from __future__ import annotations

import pytest
from os_ken.ofproto import ofproto_v1_3_parser as parser

from controller import ofmsg
from controller.core import ControllerCore
from controller.intents import COOKIE, Drop
from controller.gray import PROBE_ETH_TYPE, GrayConfig, GrayWatch
from fabric import topofile
from fabric.emulation import plan
from fabric.emulation.faults import Faults
from fabric.errors import EmulationError, FabriclabError
from tests.fakeoftable import FakeFabric, apply_out, flow_stats
from tests.test_controller_core import tcp
from tests.test_sync import connect

LINK, FAR = ("s1", 3), ("s2", 7)


def watch(**kw):
    return GrayWatch({LINK: FAR}, GrayConfig(**kw))


def burst(w, now, copies=20):
    ports = w.burst_due("s1", now)
    assert ports == (3,)
    w.sent("s1", ports, copies)


# ---- the ledger, by hand ----------------------------------------------------------------------------
def test_the_schedule_is_probes_rounds_early_in_each_period_and_one_reading_settle_s_into_it():
    w = watch(period_s=1.0, probes=3)  # the defaults: the burst in the first 0.2 s, the reading at 0.95 s
    # one probe per port per call, 3 rounds, only in the first burst_s
    assert [w.burst_due("s1", t) for t in (10.0, 10.01, 10.02, 10.03)] == [(3,), (3,), (3,), ()]
    assert w.burst_due("s1", 11.21) == () and w.burst_due("s1", 12.19) == (3,)
    assert w.burst_due("s2", 10.0) == ()  # s2 sends on no probed link
    assert not w.read_due("s2", 10.94) and w.read_due("s2", 10.95) and not w.read_due("s2", 10.99)
    assert w.read_due("s2", 11.96) and not w.read_due("s1", 11.97)  # s1 counts no probed link
    w.port_state(LINK, False)
    assert w.burst_due("s1", 13.0) == ()  # no probes out of a port that is down
    w.port_state(LINK, True)
    assert w.burst_due("s1", 14.0) == (3,)


def test_two_lossy_readings_in_a_row_make_a_link_gray_and_three_clean_ones_heal_it():
    w = watch(loss=0.05, min_lost=2)
    assert w.on_counts("s2", {7: 500}, 0.7) == []  # first reading: the ledger starts (500 from before)
    burst(w, 1.0)
    assert w.on_counts("s2", {7: 520}, 1.7) == []  # 20 of 20
    burst(w, 2.0)
    assert w.on_counts("s2", {7: 534}, 2.7) == []  # 6 of 20 lost: lossy, once
    burst(w, 3.0)
    (v,) = w.on_counts("s2", {7: 549}, 3.7)  # 5 of 20 lost: twice -> gray
    assert (v.link, v.gray, v.lost, v.sent) == (LINK, True, 5, 20) and w.is_gray(LINK)
    assert v.describe() == "s1:3 gray: 5 of 20 probes lost"
    for t, total in ((4.0, 569), (5.0, 589)):
        burst(w, t)
        assert w.on_counts("s2", {7: total}, t + 0.7) == []
    burst(w, 6.0)
    (v,) = w.on_counts("s2", {7: 609}, 6.7)
    assert (v.gray, v.lost, v.sent) == (False, 0, 20) and not w.is_gray(LINK)
    assert w.last_reading(LINK) == (0, 20)


def test_probes_sent_after_the_counters_were_asked_for_are_not_judged_in_that_reading():
    # the reading is asked for at 0.95 s into each period; its answer comes back after the next burst
    # began (a busy controller): the probes of that burst cannot be in the counters, so they are not
    # lost, they are judged in the next reading (before, 2 of 20 "lost" in every reading: gray)
    w = watch()
    assert w.read_due("s2", 0.95)
    w.on_counts("s2", {7: 0}, 0.96)
    w.sent("s1", (3,), 2)  # period 1's first two probes
    for k in range(1, 6):
        w.sent("s1", (3,), 18)  # the rest of period k's burst
        assert w.read_due("s2", k + 0.95)
        w.sent("s1", (3,), 2)  # period k + 1's first two probes, at k + 1.0, before the answer
        # every probe sent before k + 0.95 was counted: 20 per period
        assert w.on_counts("s2", {7: 20 * k}, k + 1.01) == []
        assert w.last_reading(LINK) == (0, 20) and not w.is_gray(LINK)


def test_a_late_count_makes_one_reading_look_lossy_and_the_next_gain_so_no_link_turns_gray():
    w = watch()
    w.on_counts("s2", {7: 0}, 0.7)
    total = 0
    for k in range(1, 9):
        burst(w, float(k))
        total += 20
        # every other reading the datapath has not refreshed the counter: half the count comes late
        seen = total - 10 if k % 2 else total
        assert w.on_counts("s2", {7: seen}, k + 0.7) == []
    assert not w.is_gray(LINK)


def test_single_losses_below_the_thresholds_are_not_lossy():
    w = watch(loss=0.05, min_lost=2, bad_bursts=2)
    w.on_counts("s2", {7: 0}, 0.7)
    total = 0
    for k in range(1, 6):
        burst(w, float(k))
        total += 19  # one probe lost per burst: below min_lost
        assert w.on_counts("s2", {7: total}, k + 0.7) == []
    burst(w, 6.0, copies=100)  # 4 of 100 lost: >= min_lost but below 5%
    total += 96
    assert w.on_counts("s2", {7: total}, 6.7) == []


def test_a_link_gray_again_soon_after_healing_must_stay_clean_twice_as_long():
    w = watch(clean_bursts=2, repeat_window_s=60.0)
    w.on_counts("s2", {7: 0}, 0.7)
    total, t = 0, 1.0
    verdicts = []

    def reading(arrived):
        nonlocal total, t
        burst(w, t)
        total += arrived
        verdicts.append([(v.gray, round(t)) for v in w.on_counts("s2", {7: total}, t + 0.7)])
        t += 1.0

    for arrived in (10, 10, 20, 20, 10, 10, 20, 20, 20, 20):
        reading(arrived)
    flat = [v for vs in verdicts for v in vs]
    # gray at the 2nd lossy reading (t=2), healed after 2 clean ones (t=4); gray again at t=6 (2 s
    # after healing): now 4 clean readings are needed, t=7..10
    assert flat == [(True, 2), (False, 4), (True, 6), (False, 10)]


def test_probes_lost_on_a_busy_link_are_its_queue_s_not_a_failure_and_end_a_lossy_run():
    w = watch(loss=0.05, min_lost=2, bad_bursts=2, clean_bursts=2)
    w.on_counts("s2", {7: 0}, 0.7)
    total, t = 0, 1.0

    def reading(arrived, busy):
        nonlocal total, t
        burst(w, t)
        if busy:
            w.note_busy([LINK, ("s9", 1)])  # a link nobody probes is ignored
        total += arrived
        out = [(v.gray, round(t)) for v in w.on_counts("s2", {7: total}, t + 0.7)]
        t += 1.0
        return out

    # 5 of 20 lost in every reading; the link busy in every other one: never two judged lossy in a row
    assert [reading(15, busy=k % 2 == 1) for k in range(6)] == [[]] * 6
    assert not w.is_gray(LINK)
    # the busy mark is for one reading: two lossy readings with no busy sample make it gray
    assert reading(15, busy=False) == [] and reading(15, busy=False) == [(True, 8)]
    # a gray link's clean readings while busy do not heal it; two judged clean ones do
    assert reading(20, busy=True) == [] and reading(20, busy=True) == [] and reading(20, busy=False) == []
    assert reading(20, busy=False) == [(False, 12)]


def test_a_counter_that_starts_again_restarts_the_ledger_instead_of_reading_as_loss():
    w = watch()
    w.on_counts("s2", {7: 1000}, 0.7)
    burst(w, 1.0)
    assert w.on_counts("s2", {7: 3}, 1.7) == []  # the counting flow was re-installed
    for k in (2, 3):
        burst(w, float(k))
        assert w.on_counts("s2", {7: 3 + 20 * (k - 1)}, k + 0.7) == []
    assert not w.is_gray(LINK)


def test_bad_settings_are_named():
    for kw in ({"period_s": -1}, {"period_s": 1, "settle_s": 1.5}, {"probes": 0}, {"loss": 1.0},
               {"clean_bursts": 100}, {"busy_util": 0}):
        with pytest.raises(FabriclabError):
            GrayConfig(**kw)
    assert not GrayConfig(period_s=0).enabled


# ---- messages ---------------------------------------------------------------------------------------
def test_a_probe_round_is_one_packet_out_with_copies_times_ports_outputs_of_a_probe_frame():
    msg = ofmsg.probe_burst((2, 5), 3)
    assert isinstance(msg, parser.OFPPacketOut)
    assert [a.port for a in msg.actions] == [2, 5, 2, 5, 2, 5]
    frame = ofmsg.probe_frame()
    assert len(frame) == 60 and int.from_bytes(frame[12:14], "big") == PROBE_ETH_TYPE == 0x88B5
    assert frame[0] & 1 == 0 and frame[0] & 2 == 2  # unicast, locally administered


def test_counting_flows_come_back_from_the_switch_as_what_the_core_installs():
    fab = topofile.load("dual-plane-16")
    core = ControllerCore(fab, "adaptive")
    fake = FakeFabric(fab)
    fake.apply(core.on_switch_connect(fab.switch_by_name["leafA0"].dpid))
    dpid = fab.switch_by_name["leafA0"].dpid
    back = {f.key: f for f in (ofmsg.flow_from_stats(dpid, st) for st in flow_stats(fake, "leafA0", COOKIE)) if f}
    probes = [f for f in core.flows("leafA0") if dict(f.match).get("eth_type") == PROBE_ETH_TYPE]
    assert probes and all(isinstance(f.action, Drop) and f.table == 0 for f in probes)
    # leafA0's two spine ports count probes; none on its host ports
    assert sorted(dict(f.match)["in_port"] for f in probes) == [1, 2]
    assert all(back[f.key] == f for f in probes)
    off = ControllerCore(fab, "adaptive", gray=GrayConfig(period_s=0))
    assert not any(dict(f.match).get("eth_type") == PROBE_ETH_TYPE for f in off.flows("leafA0"))


# ---- on the fake pipeline ---------------------------------------------------------------------------
def run_probing(core, fake, sessions, t0, t1, step=0.01):
    """Drive every session's poll schedule from t0 to t1: bursts go out on the fake, probe-counter
    requests are answered from its flow counters. Returns the verdicts."""
    verdicts = []
    t = t0
    while t < t1:
        for dpid, s in sessions.items():
            sw = core.switch_name(dpid)
            for _, req in apply_out(fake, s.due(t, False)):
                if isinstance(req, parser.OFPFlowStatsRequest) and s.is_probe_reply(req.xid):
                    counts = ofmsg.probe_counts_from_stats(
                        [st for st in flow_stats(fake, sw, COOKIE) if st.table_id == 0])
                    apply_out(fake, s.on_probe_counts(req.xid, counts, False, t))
                    verdicts += s.last_gray
        t = round(t + step, 6)
    return verdicts


def setup_fabric(mode):
    fab = topofile.load("dual-plane-16")
    core = ControllerCore(fab, mode)
    fake = FakeFabric(fab)
    sessions = {}
    for sw in fab.switches:
        s, _ = connect(core, fake, sw.name)
        sessions[s.dpid] = s
    return fab, core, fake, sessions


def test_a_lossy_link_is_found_taken_out_of_service_and_brought_back_once_it_heals():
    fab, core, fake, sessions = setup_fabric("adaptive")
    ip = str(fab.nic("h15", "A").ip)
    # slot 0 from h0 to h15 (sport 49152) goes leafA0 -> spineA0 -> leafA3 (spineA0 port 4)
    assert fake.trace("h0", 0, tcp(ip, 49152)) == ["leafA0", "spineA0", "leafA3", "h15"]
    assert run_probing(core, fake, sessions, 0.0, 3.0) == []  # healthy: every probe arrives
    fake.loss[("spineA0", 4)] = 0.3  # 6 of every 20 probes lost
    verdicts = run_probing(core, fake, sessions, 3.0, 6.0)
    assert [(v.link, v.gray, v.lost, v.sent) for v in verdicts] == [(("spineA0", 4), True, 6, 20)]
    assert verdicts[0].time_s == pytest.approx(4.95, abs=0.02)  # the 2nd lossy reading: bursts at 3 and 4 s
    assert not core.policy.is_up(("spineA0", 4)) and not core.policy.is_up(("leafA3", 1))
    assert fake.trace("h0", 0, tcp(ip, 49152)) == ["leafA0", "spineA1", "leafA3", "h15"]
    (event,) = [e for e in core.policy.events() if e.trigger.startswith("spineA0:4")]
    assert event.cause == "failure" and event.trigger == "spineA0:4 gray: 6 of 20 probes lost"
    assert core.gray.gray_links() == (("spineA0", 4),)
    fake.loss.clear()
    verdicts = run_probing(core, fake, sessions, 6.0, 10.0)
    assert [(v.link, v.gray) for v in verdicts] == [(("spineA0", 4), False)]
    # the burst at 5 s was lossy too; 3 clean readings: 6.95, 7.95, 8.95
    assert verdicts[0].time_s == pytest.approx(8.95, abs=0.02)
    assert core.policy.is_up(("spineA0", 4))
    assert fake.trace("h0", 0, tcp(ip, 49152)) == ["leafA0", "spineA0", "leafA3", "h15"]
    assert core.policy.events()[-1].trigger == "spineA0:4 healed: 0 of 20 probes lost"


def test_a_lossy_link_a_port_sample_finds_full_is_not_taken_out_until_its_load_drops():
    fab, core, fake, sessions = setup_fabric("adaptive")
    spine = fab.switch_by_name["spineA0"].dpid
    (gbps,) = {l.rate_gbps for l in fab.links if {l.a.node, l.b.node} == {"spineA0", "leafA3"}}
    fake.loss[("spineA0", 4)] = 0.3  # 6 of every 20 probes lost, in every reading
    sent_bytes, t = 0.0, 0.0

    def carry(share, until):
        # spineA0 port 4 sends `share` of its rate, a port sample every 0.25 s (the switch's clock)
        nonlocal sent_bytes, t
        verdicts = []
        while t < until - 1e-9:
            core.on_port_counters(spine, {4: (int(sent_bytes), 0, t)})
            verdicts += run_probing(core, fake, sessions, t, t + 0.25)
            sent_bytes += share * gbps * 1e9 / 8 * 0.25
            t = round(t + 0.25, 6)
        return verdicts

    assert carry(0.9, 6.0) == [] and core.policy.is_up(("spineA0", 4))  # full: its queue's losses
    verdicts = carry(0.5, 9.0)  # half full: the losses are the link's
    assert [(v.link, v.gray) for v in verdicts] == [(("spineA0", 4), True)]
    # the reading at 6.95 still holds the sample taken at 6.0 (of 5.75-6.0, full): not judged; those
    # at 7.95 and 8.95 are lossy
    assert verdicts[0].time_s == pytest.approx(8.95, abs=0.02)
    assert not core.policy.is_up(("spineA0", 4))


def test_a_gray_link_whose_carrier_goes_and_comes_back_stays_out_until_it_heals():
    fab, core, fake, sessions = setup_fabric("adaptive")
    fake.loss[("leafA3", 1)] = 0.5  # the other direction of spineA0:4
    run_probing(core, fake, sessions, 0.0, 3.0)
    assert core.gray.gray_links() == (("leafA3", 1),) and not core.policy.is_up(("spineA0", 4))
    spine, leaf = fab.switch_by_name["spineA0"].dpid, fab.switch_by_name["leafA3"].dpid
    fake.set_link("spineA0", 4, False)
    assert core.on_port_status(spine, 4, False, 3.1) == []  # out already
    fake.set_link("spineA0", 4, True)
    assert core.on_port_status(spine, 4, True, 3.2) == [] and core.on_port_status(leaf, 1, True, 3.2) == []
    assert not core.policy.is_up(("spineA0", 4))  # the carrier is back, the loss is not gone
    fake.loss.clear()
    run_probing(core, fake, sessions, 3.3, 7.0)
    assert core.gray.gray_links() == () and core.policy.is_up(("spineA0", 4))


def test_a_link_that_heals_while_one_end_reports_its_port_down_comes_back_with_that_port():
    fab, core, fake, sessions = setup_fabric("adaptive")
    fake.loss[("spineA0", 4)] = 0.5
    run_probing(core, fake, sessions, 0.0, 3.0)
    assert core.gray.gray_links() == (("spineA0", 4),)
    leaf = fab.switch_by_name["leafA3"].dpid
    assert core.on_port_status(leaf, 1, False, 3.1) == []  # leafA3's end reports down; spineA0's does not
    fake.loss.clear()
    verdicts = run_probing(core, fake, sessions, 3.2, 7.0)  # spineA0:4's probes still arrive: it heals
    assert [(v.link, v.gray) for v in verdicts] == [(("spineA0", 4), False)]
    assert not core.policy.is_up(("spineA0", 4))  # but leafA3:1 is down: the link stays out
    assert core.on_port_status(leaf, 1, True, 7.1) != []  # and comes back with it
    assert core.policy.is_up(("spineA0", 4)) and core.policy.is_up(("leafA3", 1))


def test_under_ecmp_a_gray_link_is_reported_but_the_routing_does_not_change():
    _, core, fake, sessions = setup_fabric("ecmp")
    fake.loss[("spineA0", 4)] = 0.3
    verdicts = run_probing(core, fake, sessions, 0.0, 3.0)
    assert [(v.link, v.gray) for v in verdicts] == [(("spineA0", 4), True)]
    assert core.policy.is_up(("spineA0", 4)) and core.policy.events() == ()


# ---- the emulator's side ----------------------------------------------------------------------------
def test_the_loss_filter_drops_with_the_probability_asked_for():
    # cBPF: ld rand; jge K -> match (-1: the redirect into the sink) else no match (0); K = (1 - loss) * 2^32
    assert plan.loss_bytecode(0.25) == "4,32 0 0 4294963256,53 0 1 3221225472,6 0 0 4294967295,6 0 0 0"
    assert plan.loss_bytecode(1.0).split(",")[2] == "53 0 1 0"  # every packet
    assert plan.loss_bytecode(1e-12).split(",")[2] == "53 0 1 4294967295"
    for bad in (0, -0.1, 1.5):
        with pytest.raises(EmulationError):
            plan.loss_bytecode(bad)
    cmds = plan.gray_commands("s1-eth4", 2.0, 0.25, had_loss=False, sink="s1-gs0")
    assert cmds[0] == ["tc", "class", "change", "dev", "s1-eth4", "parent", "5:", "classid", "5:1", "htb", "rate",
                       "2mbit", "burst", "15k", "quantum", "1514"]
    assert cmds[1] == ["tc", "qdisc", "replace", "dev", "s1-eth4", "clsact"]
    assert cmds[2][-8:] == ["bytecode", plan.loss_bytecode(0.25), "action", "mirred", "egress", "redirect", "dev",
                            "s1-gs0"]
    assert plan.gray_commands("s1-eth4", 40.0, 0.0, had_loss=True, sink="s1-gs0")[1] == [
        "tc", "qdisc", "del", "dev", "s1-eth4", "clsact"]
    assert len(plan.gray_commands("s1-eth4", 40.0, 0.0, had_loss=False, sink="s1-gs0")) == 1
    fab = topofile.load("dual-plane-16")
    assert plan.gray_sink_names(fab) == ("leafA0-gs0", "leafA0-gs1")
    assert plan.sink_commands(("a", "b"))[0] == ["ip", "link", "add", "a", "type", "veth", "peer", "name", "b"]


class _GrayNet:
    def __init__(self, fabric):
        self.fabric = fabric
        self.calls = []

    def set_interfaces(self, ends, up):
        return 0.0, 0.0

    def set_gray(self, ends, rate_fraction, loss):
        self.calls.append((tuple(ends), rate_fraction, loss))
        return 1.0, 1.1


def test_gray_faults_change_both_ends_of_the_link_and_are_logged():
    fab = topofile.load("dual-plane-16")
    net = _GrayNet(fab)
    f = Faults(net)
    e1 = f.lossy("spineA0", 4, 0.3)
    e2 = f.degrade("leafA3", 1, 0.1)
    e3 = f.heal("spineA0", 4)
    ends = (("leafA3", 1), ("spineA0", 4))
    assert [(tuple(sorted(c[0])), c[1], c[2]) for c in net.calls] == [(ends, 1.0, 0.3), (ends, 0.1, 0.0),
                                                                      (ends, 1.0, 0.0)]
    assert [e.describe() for e in f.log] == ["lossy spineA0:4 losing 0.3 of its packets",
                                             "degrade leafA3:1 to 0.1 of its rate", "heal spineA0:4"]
    assert (e1.up, e2.up, e3.up) == (False, False, True) and e1.at_s == 1.0
    for bad in (lambda: f.lossy("spineA0", 4, 0), lambda: f.degrade("spineA0", 4, 1.0),
                lambda: f.lossy("spineA0", 99, 0.5)):
        with pytest.raises(FabriclabError):
            bad()
    assert len(f.log) == 3
