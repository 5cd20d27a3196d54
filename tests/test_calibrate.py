"""The calibration of the simulator against the emulator: its features, the fit and the file (no root).

Expected values are worked by hand from the ring schedule: a ring all-reduce over n hosts is 2(n-1)
steps one after another, each a transfer of S/n bytes per host; on dual-plane-16 (two 200G NICs per
host, non-blocking leaves) a step drains in (S/n) x 8 / 400 Gbit/s. The slowest chain of deliveries runs
through a sender whose neighbour sits on another leaf: 4 links per transfer (host, leaf, spine, leaf,
host), so a delay h per hop adds 2(n-1) x 4 x h, and a delay a per transfer 2(n-1) x a.
The emulation side (the microbenchmarks and the cross-check of real traces) is in
tests/emulation/test_calibration.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric import topofile
from fabriclab import calibrate as cal
from fabriclab.cli import main
from traffic.replay import ReplayOptions

DP16 = topofile.load("dual-plane-16")


def ring_sample(n: int, size: int, host_bps: float, hops: int, dilation: float, g: float, a_s: float,
                h_s: float) -> cal.Sample:
    """A ring all-reduce as the emulator would time it if the model held with (g, a, h) exactly."""
    steps = 2 * (n - 1)
    t0_us = steps * size / n * 8 / host_bps * 1e6
    emulated_us = t0_us / g + steps * (a_s + hops * h_s) / dilation * 1e6
    return cal.Sample("dual-plane-16", "adaptive", "all_reduce", size, dilation, emulated_us, t0_us, steps,
                      steps * hops)


@pytest.mark.parametrize("cut_through", [False, True], ids=["store-and-forward", "cut-through"])
def test_the_simulators_features_of_a_ring_are_the_hand_worked_ones(cut_through):
    # store and forward: every step waits for the one before in full, so each of the 2(n-1) steps
    # adds its delays. Cut-through: a pair's steps take its connections one after another, each
    # holding them for the per-transfer delay before its first byte, so the 2(n-1) per-transfer delays
    # still add up, but the latency per hop is paid once, after the last byte (4 hops)
    n, size = 16, 64_000_000
    w = cal.micro_workload(n, [size, 4 * size])
    feats = cal.features(w, DP16, "adaptive", ReplayOptions(ranks=n, ports="planned", dilation=1.0), cut_through)
    for (t0_us, s, h), sz in zip(feats, (size, 4 * size)):
        assert t0_us == pytest.approx(2 * (n - 1) * sz / n * 8 / 400e9 * 1e6, rel=1e-6)
        assert s == pytest.approx(2 * (n - 1), rel=1e-4)
        assert h == pytest.approx(4 if cut_through else 2 * (n - 1) * 4, rel=1e-4)


def test_the_fit_recovers_the_parameters_the_samples_were_made_with():
    truth = dict(g=0.88, a_s=0.012, h_s=0.006)
    samples = [ring_sample(16, size, 400e9, hops, 1e5, **truth)
               for size in (4e8, 1.2e9, 3.6e9) for hops in (2, 4, 6)]
    fitted = cal.fit(samples)
    assert fitted.goodput_share == pytest.approx(truth["g"], rel=1e-6)
    assert fitted.per_transfer_emu_s == pytest.approx(truth["a_s"], rel=1e-5)
    assert fitted.per_hop_emu_s == pytest.approx(truth["h_s"], rel=1e-5)
    assert all(fitted.predict_us(s) == pytest.approx(s.emulated_us, rel=1e-9) for s in samples)
    # at dilation D the simulator is given the latencies divided by D
    opts = fitted.sim_options(2e5)
    assert opts.goodput_share == fitted.goodput_share
    assert opts.per_transfer_s == pytest.approx(truth["a_s"] / 2e5, rel=1e-5)
    assert opts.per_hop_s == pytest.approx(truth["h_s"] / 2e5, rel=1e-5)
    assert opts.cut_through is fitted.cut_through is cal.CUT_THROUGH
    assert cal.fit(samples, cut_through=False).sim_options(2e5).cut_through is False


#: A CI run's microbenchmarks (2026-12-02, busy core): emulated us per (fabric, size), with the
#: simulator's features (T0 us, S, H) at dilation 1e5. The three-parameter fit found 14.31 ms per hop
#: in them (and 1.00 ms per transfer), which put 24% latency into a ResNet all-reduce on pyramid-16.
MEASURED = [("dual-plane-16", 400_000, 17.3228, 15.0, 30, 4), ("dual-plane-16", 1_200_000, 48.9655, 45.0, 30, 4),
            ("dual-plane-16", 3_600_000, 149.7655, 135.0, 30, 4), ("pyramid-16", 400_000, 17.6110, 15.0, 30, 6),
            ("pyramid-16", 1_200_000, 49.1030, 45.0, 30, 6), ("pyramid-16", 3_600_000, 151.5532, 135.0, 30, 6)]


@pytest.mark.parametrize("extra_us_per_hop, kept", [(0.0, False), (1.5, True)])
def test_a_per_hop_delay_is_fitted_only_where_the_samples_tell_it_from_the_per_transfer_one(extra_us_per_hop, kept):
    # Every ring has S = 30 and one H per fabric, so only the two fabrics' hop counts tell a per-hop
    # delay from a per-transfer one. As measured, pyramid's rings were 0.1-1.8 us slower: the F-test
    # of the nested fits (worked here with numpy alone) finds no per-hop delay there, and the fit is the
    # two-parameter one. With 1.5 us more per hop of the ring's path (pyramid's rings then 3 us slower
    # than dual-plane's at every size), the per-hop delay is kept and found.
    import numpy as np

    samples = [cal.Sample(topo, "adaptive", "all_reduce", size, 1e5, e + extra_us_per_hop * hops, t0, s, hops)
               for topo, size, e, t0, s, hops in MEASURED]
    e = np.array([x.emulated_us for x in samples])
    a = np.array([[x.t0_us, x.transfers_on_path / x.dilation * 1e6, x.hops_on_path / x.dilation * 1e6]
                  for x in samples]) / e[:, None]

    def rss(cols):
        x, *_ = np.linalg.lstsq(a[:, :cols], np.ones(len(samples)), rcond=None)
        return float(np.sum((a[:, :cols] @ x - 1) ** 2)), x

    (rss_2, x_2), (rss_3, x_3) = rss(2), rss(3)
    assert min(x_2) > 0 and min(x_3) > 0 and x_2[0] >= 1 and x_3[0] >= 1  # inside the bounds: lsq_linear's too
    f_stat = (rss_2 - rss_3) / (rss_3 / (len(samples) - 3))
    assert (f_stat > 10.128) == kept  # F(1, 3) at p = 0.05, from the table
    fitted = cal.fit(samples)
    if kept:
        assert fitted.per_hop_emu_s == pytest.approx(x_3[2], rel=1e-6)
        # 1.5 us real per hop at dilation 1e5: 0.15 s emulated per hop (H h / D)
        assert fitted.per_hop_emu_s == pytest.approx(1.5e-6 * 1e5, rel=0.2)
    else:
        assert x_3[2] * 1e3 == pytest.approx(14.31, abs=0.05)  # what the three-parameter fit found
        assert fitted.per_hop_emu_s == 0.0
        assert fitted.per_transfer_emu_s == pytest.approx(x_2[1], rel=1e-6)
        assert fitted.goodput_share == pytest.approx(1 / x_2[0], rel=1e-6)


def test_the_fit_keeps_the_goodput_share_at_most_one_and_the_delays_non_negative():
    # an emulator faster than the links' rate with negative latency cannot be represented: the
    # constrained solution is g = 1, a = h = 0 here
    samples = [ring_sample(16, size, 400e9, 4, 1e5, g=1.0, a_s=0.0, h_s=0.0) for size in (4e8, 1.2e9, 3.6e9)]
    faster = [cal.Sample(**{**s.__dict__, "emulated_us": s.emulated_us * 0.9}) for s in samples]
    fitted = cal.fit(faster)
    assert fitted.goodput_share == pytest.approx(1.0, abs=1e-6) and fitted.goodput_share <= 1.0
    assert 0 <= fitted.per_transfer_emu_s < 1e-6 and 0 <= fitted.per_hop_emu_s < 1e-6
    with pytest.raises(cal.CalibrationError, match="at least 3 samples"):
        cal.fit(samples[:2])


def test_calibrate_fits_the_fastest_of_the_repeated_microbenchmarks_and_names_a_short_run():
    # an "emulator" that times dual-plane-16's ring by hand (2(n-1) steps of size/n at the host's 400G,
    # each with a + 4 hops x h of delay at the dilation) and stalls some repeats: the fit must see
    # through the stalls (a stall only adds time, so the fastest repeat is the clean one)
    from types import SimpleNamespace

    n, g, a_s, h_s = 16, 0.9, 0.008, 0.001
    stalled = {1: 1.4, 3: 1.25}  # the collective's position in the looped run -> time factor

    def by_hand(size: int, dilation: float) -> float:
        steps = 2 * (n - 1)
        return steps * size / n * 8 / 400e9 * 1e6 / g + steps * (a_s + 4 * h_s) / dilation * 1e6

    def run(w, fab, routing, opts):
        assert fab is DP16 and opts.repeat == 2 and opts.algorithm == "ring"
        sizes = [c.size_bytes for c in w.ranks[0].steps[0].collectives]
        colls = [SimpleNamespace(index=i, kind="all_reduce", size_bytes=sizes[i % 3],
                                 duration_real_us=by_hand(sizes[i % 3], opts.dilation) * stalled.get(i, 1.0))
                 for i in range(3 * opts.repeat)]
        return SimpleNamespace(collectives=colls[::-1])  # in any order: the index says which

    fitted = cal.calibrate([(DP16, "adaptive")], run, repeat=2, cut_through=False)
    assert len(fitted.samples) == 3
    for smp in fitted.samples:
        assert smp.emulated_us == pytest.approx(by_hand(smp.size_bytes, smp.dilation), rel=1e-9)
        assert fitted.predict_us(smp) == pytest.approx(smp.emulated_us, rel=1e-3)
    assert fitted.goodput_share == pytest.approx(g, rel=1e-3)
    # one fabric, one hop count: only a + 4h is determined
    assert fitted.per_transfer_emu_s + 4 * fitted.per_hop_emu_s == pytest.approx(a_s + 4 * h_s, rel=1e-2)
    # the cut-through simulator puts the 2(n-1) per-transfer delays on the ring's path but the per-hop
    # latency once (4 hops): the same emulated times are 2(n-1) a' + 4 h' = 2(n-1) (a + 4 h)
    ct = cal.calibrate([(DP16, "adaptive")], run, repeat=2, cut_through=True)
    assert ct.cut_through and ct.goodput_share == pytest.approx(g, rel=1e-3)
    assert 2 * (n - 1) * ct.per_transfer_emu_s + 4 * ct.per_hop_emu_s == pytest.approx(
        2 * (n - 1) * (a_s + 4 * h_s), rel=1e-2)

    def short(w, fab, routing, opts):
        return SimpleNamespace(collectives=run(w, fab, routing, opts).collectives[:5])

    with pytest.raises(cal.CalibrationError, match="5 collectives emulated, 6 expected"):
        cal.calibrate([(DP16, "adaptive")], short, repeat=2)


def test_microbenchmark_sizes_take_the_asked_emulated_time_per_transfer():
    # dual-plane-16 at the replay's default link scale: each 200G NIC at 1 Mbit/s, 2 Mbit/s per host;
    # at dilation D bytes scale by D x 0.005 / 1000. A ring transfer is size / 16.
    sizes = cal.micro_sizes_bytes(DP16, 1e5, (0.05, 0.2))
    for size, t in zip(sizes, (0.05, 0.2)):
        emu_transfer_bytes = size / 16 * 1e5 * 0.005 / 1000
        assert emu_transfer_bytes * 8 / 2e6 == pytest.approx(t, rel=1e-6)


def test_a_calibration_file_round_trips_and_bad_files_are_named(tmp_path: Path):
    samples = [ring_sample(16, size, 400e9, 4, 1e5, g=0.9, a_s=0.01, h_s=0.0) for size in (4e8, 1.2e9, 3.6e9)]
    c = cal.fit(samples)
    path = tmp_path / "cal.json"
    c.write(path)
    back = cal.Calibration.read(path)
    assert back.goodput_share == c.goodput_share and back.samples == c.samples and back.cut_through is c.cut_through
    # a file from before the cut-through simulator: its features were store and forward
    old = json.loads(path.read_text())
    del old["cut_through"]
    path.write_text(json.dumps(old))
    assert cal.Calibration.read(path).cut_through is False
    bad = tmp_path / "bad.json"
    for text, match in (("{", "not a calibration file"), ('{"version": 99}', "version"),
                        ('{"version": 1, "goodput_share": 0.9}', "missing or malformed"),
                        ('{"version": 1, "goodput_share": 1.5, "per_transfer_emu_s": 0, "per_hop_emu_s": 0}',
                         "goodput_share"),
                        ('{"version": 1, "goodput_share": 0.9, "per_transfer_emu_s": 0, "per_hop_emu_s": 0, '
                         '"cut_through": "yes"}', "cut_through must be true or false")):
        bad.write_text(text)
        with pytest.raises(cal.CalibrationError, match=match):
            cal.Calibration.read(bad)
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(cal.CalibrationError, match="not a calibration file"):
        cal.Calibration.read(bad)
    with pytest.raises(cal.CalibrationError, match="no such calibration file"):
        cal.Calibration.read(tmp_path / "missing.json")


def test_crosscheck_with_a_bad_calibration_exits_2_naming_it(tmp_path: Path, capsys):
    bad = tmp_path / "cal.json"
    bad.write_text(json.dumps({"version": 1}))
    assert main(["crosscheck", "--calibration", str(bad), "--out", str(tmp_path / "out")]) == 2
    assert "cal.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_only_bandwidth_bound_collectives_that_are_not_pipelined_chains_are_comparable():
    row = cal.CrossRow(0, 0, "all_reduce", 8_000_000, 100.0, 110.0, latency_share=0.05)
    assert row.comparable and row.difference == pytest.approx(0.10)
    assert not cal.CrossRow(0, 0, "all_reduce", 424, 4.0, 3.0, latency_share=0.9).comparable  # latency-bound
    for kind in ("broadcast", "reduce"):  # store-and-forward chunks against the emulator's cut-through
        r = cal.CrossRow(0, 0, kind, 212_480, 10.0, 23.0, latency_share=0.1)
        assert r.bandwidth_bound and not r.comparable
        assert "pipelined chain" in cal.format_rows([r])
