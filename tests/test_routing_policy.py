"""The routing policies through their one interface: `port(switch, dest, slot)` and
`path(src NIC, dst NIC, source port)`, for the three built-in modes and a researcher's own policy
loaded by name. Expected ports are worked out by hand from the topology files and the documented
entropy rule (slot = (source port >> 1) & 15 at the leaf tier; slot s -> the (s mod k)-th port)."""
from __future__ import annotations

import itertools

import pytest

from controller.core import ControllerCore
from fabric import topofile
from fabric.builders import dual_plane
from fabric.errors import RoutingError
from fabric.routing import AdaptivePolicy, EcmpPolicy, PathTable, RouterConfig, StaticPolicy, load_policy
from tests.fakeoftable import FakeFabric
from tests.policies import LastPortPolicy
from tests.test_controller_core import _fail, tcp


def policy(cls, topo="dual-plane-16"):
    return cls(PathTable(topofile.load(topo)))


def test_load_policy_knows_the_built_ins_and_a_class_by_module_path():
    assert load_policy("static") is StaticPolicy
    assert load_policy("ecmp") is EcmpPolicy
    assert load_policy("adaptive") is AdaptivePolicy
    assert load_policy("tests.policies:LastPortPolicy") is LastPortPolicy
    with pytest.raises(RoutingError, match="'magic' is not a built-in mode"):
        load_policy("magic")
    with pytest.raises(RoutingError, match="cannot import module 'no_such_module'"):
        load_policy("no_such_module:X")
    with pytest.raises(RoutingError, match="'RouterConfig' in 'fabric.routing' is not a RoutingPolicy"):
        load_policy("fabric.routing:RouterConfig")


def test_ecmp_and_adaptive_ports_follow_the_entropy_rule():
    # dual-plane-16: leafA0's uplinks are port 1 (spineA0) and port 2 (spineA1); towards leafA3
    for cls in (EcmpPolicy, AdaptivePolicy):
        p = policy(cls)
        assert [p.port("leafA0", "leafA3", s) for s in range(16)] == [1, 2] * 8
        assert p.port_for("leafA0", "leafA3", 49152 + 2 * 5) == 2
        # spines have one way down to leafA3: port 4
        assert p.port("spineA1", "leafA3", 7) == 4


def test_static_takes_one_port_per_destination_whatever_the_slot():
    p = policy(StaticPolicy)
    # destination leafA3 is edge switch index 3 in sorted order (leafA0..3, leafB0..3): 3 mod 2 -> port 2
    assert {p.port("leafA0", "leafA3", s) for s in range(16)} == {2}
    assert p.decision_points() == ()


def test_whole_paths_by_source_port():
    fab = topofile.load("dual-plane-16")
    p = AdaptivePolicy(PathTable(fab))
    h0, h15 = fab.nic("h0", "A"), fab.nic("h15", "A")
    assert p.path(h0, h15, 49152) == ("h0", "leafA0", "spineA0", "leafA3", "h15")
    assert p.path(h0, h15, 49154) == ("h0", "leafA0", "spineA1", "leafA3", "h15")
    assert p.path(fab.nic("h0", "B"), fab.nic("h15", "B"), 49154) == ("h0", "leafB0", "spineB1", "leafB3", "h15")
    with pytest.raises(RoutingError, match="different planes"):
        p.path(h0, fab.nic("h15", "B"), 49152)
    # pyramid-16 across pods: ToR -> agg -> core -> agg -> ToR, each tier deciding by its own bits
    pyr = topofile.load("pyramid-16")
    q = EcmpPolicy(PathTable(pyr))
    paths = {q.path(pyr.nic("h0", "A"), pyr.nic("h8", "A"), sp) for sp in range(49152, 65536, 2)}
    assert len(paths) == 8  # 2 aggs x 2 cores x 2 aggs, every one reachable by some source port
    assert all(len(x) == 7 for x in paths)


def test_adaptive_reroutes_and_ecmp_does_not():
    fab = topofile.load("dual-plane-16")
    for cls, reacts in ((EcmpPolicy, False), (AdaptivePolicy, True)):
        p = cls(PathTable(fab))
        moves = p.on_link_change("spineA0", 4, False, 1.0)  # spineA0 -> leafA3
        assert bool(moves) == reacts
        assert p.is_up(("spineA0", 4)) is False and p.is_up(("leafA3", 1)) is False
        assert p.alive("leafA0", "leafA3") == (2,)
        if reacts:
            assert {p.port("leafA0", "leafA3", s) for s in range(16)} == {2}
            (event,) = p.events()
            assert event.cause == "failure" and event.trigger == "spineA0:4 down" and len(event.moves) == len(moves)


def test_config_is_enforced():
    with pytest.raises(RoutingError, match="cool_util < hot_util"):
        RouterConfig(hot_util=0.5, cool_util=0.6)
    with pytest.raises(RoutingError, match="capacity_scale must be > 0"):
        AdaptivePolicy(PathTable(topofile.load("leaf-spine-16")), capacity_scale=0)
    p = policy(EcmpPolicy, "leaf-spine-16")
    with pytest.raises(RoutingError, match="port 9 of leafA0 is not a live next hop"):
        p.move("leafA0", "leafA3", 0, 9, 1.0)
    with pytest.raises(RoutingError, match="has no ECMP choice"):
        policy(StaticPolicy, "leaf-spine-16").move("leafA0", "leafA3", 0, 1, 1.0)


def test_a_researchers_policy_runs_in_the_controller_like_a_built_in_mode():
    # leaf-spine-16: leafA0's uplinks are ports 1..4 (spineA0..3); LastPortPolicy sends every flow by 4
    fab = topofile.load("leaf-spine-16")
    core = ControllerCore(fab, "tests.policies:LastPortPolicy")
    assert core.routing == "last-port"
    fake = FakeFabric(fab)
    for sw in fab.switches:
        fake.apply(core.on_switch_connect(sw.dpid))
    ip = str(fab.nic("h12", "A").ip)
    sports = range(49152, 49152 + 64, 2)
    assert {fake.trace("h0", 0, tcp(ip, sp))[1] for sp in sports} == {"spineA3"}
    # its own failover: spineA3's link to leafA3 dies -> the next highest live port, spineA2
    _fail(fab, core, fake, "spineA3", 4, 1.0)
    assert {fake.trace("h0", 0, tcp(ip, sp))[1] for sp in sports} == {"spineA2"}
    assert core.policy.reroutes()["failure"] > 0


def test_pinned_slots_keep_their_port_through_failures_elsewhere_and_recoveries():
    # leaf-spine-16: leafA0's uplinks 1..4 = spineA0..3; spine port 4 goes to leafA3
    p = policy(AdaptivePolicy, "leaf-spine-16")
    p.move("leafA0", "leafA3", 0, 3, 1.0)  # slot 0: base port 1 -> 3
    p.move("leafA0", "leafA3", 1, 2, 1.1)  # slot 1: pinned where it is (port 2)
    assert p.pinned("leafA0", "leafA3") == {0: 3, 1: 2}
    p.on_link_change("spineA1", 4, False, 2.0)  # port 2's paths die: slot 1 must leave, slot 0 stays
    slots = p.slots("leafA0", "leafA3")
    assert slots[0] == 3 and slots[1] != 2 and 2 not in slots
    p.on_link_change("spineA1", 4, True, 3.0)
    assert p.slots("leafA0", "leafA3") == (3, 2) + tuple(q % 4 + 1 for q in range(2, 16))
    p.release("leafA0", "leafA3", None, 4.0)
    assert p.slots("leafA0", "leafA3") == tuple(q % 4 + 1 for q in range(16)) and p.pinned("leafA0", "leafA3") == {}


def test_a_researchers_policy_keeps_the_operators_pins_too():
    # LastPortPolicy puts every slot on the highest live port (4); the operator pins slot 0 on 1
    p = policy(LastPortPolicy, "leaf-spine-16")
    p.move("leafA0", "leafA3", 0, 1, 1.0)
    p.on_link_change("spineA3", 4, False, 2.0)  # port 4's paths die: everything -> 3, but slot 0 stays
    assert p.slots("leafA0", "leafA3") == (1,) + (3,) * 15
    assert [m.slot for e in p.events() if e.cause == "failure" for m in e.moves
            if (m.switch, m.dest) == ("leafA0", "leafA3")] == list(range(1, 16))
    p.on_link_change("spineA3", 4, True, 3.0)
    assert p.slots("leafA0", "leafA3")[0] == 1


# ---- two-hop detours in a mesh plane ------------------------------------------------------------
# dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh"): 4 leaves per plane in full mesh, port
# numbers by hand in tests/test_paths.py (leafA0: 1 -> leafA1, 2 -> leafA2, 3 -> leafA3; leafA3:
# 2 -> leafA1). Each leaf's 3 candidates towards another (direct + 2 detours) give the leaf tier
# 4 bits: slot = (source port >> 1) & 15, so source port 49152 + 2s is slot s.
MESH = dual_plane(hosts=8, hosts_per_leaf=2, plane_kind="mesh")
MESH_SPORTS = [49152 + 2 * s for s in range(16)]


class UnmemoisedAdaptive(AdaptivePolicy):
    link_memo = False


def _warmed_adaptive():
    p = AdaptivePolicy(PathTable(MESH))
    p.precompute_failures()  # every single-link failure below is then a memo lookup
    return p


MESH_POLICIES = {
    "ecmp": lambda: EcmpPolicy(PathTable(MESH)),  # no reaction: the data plane's fail-over order
    "adaptive": lambda: AdaptivePolicy(PathTable(MESH)),
    "adaptive-unmemoised": lambda: UnmemoisedAdaptive(PathTable(MESH)),
    "adaptive-warmed-memo": _warmed_adaptive,
}


def _dead_links_crossed(p, path):
    """Leaf-to-leaf hops of `path` over a link that is down."""
    hops = list(itertools.pairwise(path[1:-1]))
    ports = {(a.peer, s): a.port for s in ("leafA0", "leafA1", "leafA2", "leafA3") for a in MESH.adjacency[s]}
    return [(a, b) for a, b in hops if not p.is_up((a, ports[(b, a)]))]


@pytest.mark.parametrize("make", MESH_POLICIES.values(), ids=MESH_POLICIES.keys())
def test_a_failed_mesh_link_detours_over_the_other_leaves_and_comes_back(make):
    p = make()
    h0, h2, h4 = MESH.nic("h0", "A"), MESH.nic("h2", "A"), MESH.nic("h4", "A")

    def paths(src=h0, dst=h2):
        return [p.path(src, dst, sp) for sp in MESH_SPORTS]

    direct = ("h0", "leafA0", "leafA1", "h2")
    assert paths() == [direct] * 16
    p.on_link_change("leafA0", 1, False, 1.0)  # leafA0 -- leafA1 in plane A
    # every slot detours: even slots via leafA2, odd ones via leafA3 (both used, evenly)
    assert paths() == [("h0", "leafA0", f"leafA{2 + s % 2}", "leafA1", "h2") for s in range(16)]
    assert p.live_paths(h0, h2) == ((("h0", "leafA0", "leafA2", "leafA1", "h2"), 49152),
                                    (("h0", "leafA0", "leafA3", "leafA1", "h2"), 49154))
    assert paths(MESH.nic("h2", "A"), MESH.nic("h0", "A")) == [
        ("h2", "leafA1", f"leafA{2 + s % 2}", "leafA0", "h0") for s in range(16)]
    assert all(_dead_links_crossed(p, x) == [] for x in paths())
    # other pairs and the other plane keep their direct links
    assert set(paths(h0, h4)) == {("h0", "leafA0", "leafA2", "h4")}
    assert {p.path(MESH.nic("h0", "B"), MESH.nic("h2", "B"), sp) for sp in MESH_SPORTS} == {
        ("h0", "leafB0", "leafB1", "h2")}
    p.on_link_change("leafA0", 1, True, 2.0)
    assert paths() == [direct] * 16

    # the direct link and leafA0 -- leafA2 down: leafA3 is the only detour left
    p.on_link_change("leafA0", 1, False, 3.0)
    p.on_link_change("leafA0", 2, False, 3.1)
    assert paths() == [("h0", "leafA0", "leafA3", "leafA1", "h2")] * 16
    # and leafA3 -- leafA1 (leafA3 port 2): no detour left, the pair is dropped in plane A ...
    p.on_link_change("leafA3", 2, False, 3.2)
    assert paths() == [None] * 16 and p.live_paths(h0, h2) == ()
    # ... but not in plane B
    assert p.path(MESH.nic("h0", "B"), MESH.nic("h2", "B"), 49152) == ("h0", "leafB0", "leafB1", "h2")
    p.on_link_change("leafA3", 2, True, 4.0)
    assert paths() == [("h0", "leafA0", "leafA3", "leafA1", "h2")] * 16
    p.on_link_change("leafA0", 2, True, 4.1)
    # leafA2 is back as a detour: ecmp's fail-over order takes it for even slots again; adaptive
    # keeps every slot where it is and evens out by moving the highest slots (15 down to 8) to it
    via = [2 + s % 2 for s in range(16)] if p.name == "ecmp" else [3] * 8 + [2] * 8
    assert paths() == [("h0", "leafA0", f"leafA{c}", "leafA1", "h2") for c in via]
    p.on_link_change("leafA0", 1, True, 4.2)
    assert paths() == [direct] * 16
    if p.name == "adaptive":
        assert p.slots("leafA0", "leafA1") == (1,) * 16 == p.base_slots("leafA0", "leafA1")


def test_the_adaptive_policy_moves_the_slots_of_a_failed_mesh_link_to_the_live_detours():
    p = AdaptivePolicy(PathTable(MESH))
    assert p.alive("leafA0", "leafA1") == (1,)  # detours are backups: not live ports while the direct link is up
    p.on_link_change("leafA0", 1, False, 1.0)
    assert p.alive("leafA0", "leafA1") == (2, 3)
    assert p.slots("leafA0", "leafA1") == (2, 3) * 8 and p.slots("leafA1", "leafA0") == (2, 3) * 8
    (event,) = p.events()
    assert event.trigger == "leafA0:1 down" and len(event.moves) == 32  # 16 slots at each end
    # leafA2 -- leafA1 down as well: leafA0's detour via leafA2 is dead, every slot via leafA3
    p.on_link_change("leafA2", 2, False, 2.0)
    assert p.alive("leafA0", "leafA1") == (3,) and p.slots("leafA0", "leafA1") == (3,) * 16
    p.on_link_change("leafA0", 1, True, 3.0)
    assert p.slots("leafA0", "leafA1") == (1,) * 16


def test_a_detoured_packet_is_never_detoured_again():
    # leafA0 -- leafA1 and leafA2 -- leafA1 down, and the policy not reacting (ecmp): leafA0's
    # fail-over sends even slots to leafA2, whose own fail-over towards leafA1 would send even slots
    # back to leafA0 (its first detour). A detoured packet leaves leafA2 by its direct link only, so
    # it is dropped there; odd slots go via leafA3. Under adaptive every slot goes via leafA3.
    for cls in (EcmpPolicy, AdaptivePolicy):
        p = cls(PathTable(MESH))
        p.on_link_change("leafA0", 1, False, 1.0)
        p.on_link_change("leafA2", 2, False, 1.1)
        h0, h2, h4 = MESH.nic("h0", "A"), MESH.nic("h2", "A"), MESH.nic("h4", "A")
        got = [p.path(h0, h2, sp) for sp in MESH_SPORTS]
        from_h4 = [p.path(h4, h2, sp) for sp in MESH_SPORTS]
        if cls is EcmpPolicy:
            assert got == [None if s % 2 == 0 else ("h0", "leafA0", "leafA3", "leafA1", "h2") for s in range(16)]
            # leafA2's own slots: even ones fail over to leafA0, which cannot forward them on to leafA1
            assert from_h4 == [None if s % 2 == 0 else ("h4", "leafA2", "leafA3", "leafA1", "h2") for s in range(16)]
        else:
            assert got == [("h0", "leafA0", "leafA3", "leafA1", "h2")] * 16
            assert from_h4 == [("h4", "leafA2", "leafA3", "leafA1", "h2")] * 16
