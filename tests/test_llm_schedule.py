"""The generated LLM step: Megatron 1F1B order, collectives per stream, the nominal timeline by hand."""
from __future__ import annotations

from collections import defaultdict

import pytest

from fabriclab.cli import main
from traffic import metrics
from traffic.llm import build_workload, model, rules, schedule
from traffic.llm.config import Compute, LLMConfig, MoE, Model, Parallel, Stragglers
from traffic.workload import TraceError

H100_PEAK = 989e12
H100_HBM = 3.35e12


def tiny(tp: int = 1, pp: int = 2, dp: int = 1, layers: int = 4, m: int = 2, tied: bool = False,
         gpus_per_server: int = 8, moe: MoE | None = None, steps: int = 1, stragglers: Stragglers | None = None,
         **par: object) -> LLMConfig:
    return LLMConfig(
        name="tiny", model=Model(layers=layers, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=16, vocab=32768,
                                 seq_len=1024, gated_ffn=False, tied_embeddings=tied, moe=moe),
        parallel=Parallel(tp=tp, pp=pp, dp=dp, **par), micro_batch=1, global_batch=m * dp,
        gpus_per_server=gpus_per_server, compute=Compute(gpu="h100", kernel_efficiency=0.5, recompute="none"),
        steps=steps, stragglers=stragglers or Stragglers())


def test_1f1b_order_pp4_m8():
    cfg = tiny(pp=4, layers=4, m=8)
    expected = {
        0: "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        1: "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        2: "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        3: "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    }
    for stage, want in expected.items():
        assert " ".join(schedule.stage_program(cfg, stage).passes) == want, stage


def _per_stream(step):
    entries: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for c in step.collectives:
        entries[c.stream] += 1
        counts[c.stream] += c.count
    return dict(entries), dict(counts)


def test_collective_counts_per_stream_tp2_pp2_dp2():
    m = 3
    cfg = tiny(tp=2, pp=2, dp=2, layers=4, m=m, tied=True)
    wl = build_workload(cfg)
    assert wl.world_size == 8 and len(wl.ranks) == 8 and wl.format == "llm" and wl.timed
    for rt in wl.ranks:
        stage = cfg.grid.coords(rt.rank)["pp"]
        entries, counts = _per_stream(rt.steps[0])
        # pp: every micro-batch's activation and its gradient cross the one link of a 2-stage pipeline
        assert entries["pp"] == counts["pp"] == 2 * m
        # tp, per micro-batch (no sequence parallelism: only all-reduces): forward one entry standing for 2 layers x
        # 2 all-reduces (attention and MLP outputs); backward one entry per block (attention, MLP: each runs under
        # its own column-parallel linear's weight-grad GEMM) of 2 layers x 1 input-gradient all-reduce; on stage 0
        # the input embedding's all-reduce before the forward's layers (its own entry: 1 + 1 + 2 entries, 1 + 4 + 4
        # calls); on stage 1 the loss's 3 fp32 all-reduces after the forward's layers and the output layer's input
        # grad all-reduce in backward (1 + 3 + 1 + 2 entries, 4 + 3 + 1 + 4 calls)
        assert (entries["tp"], counts["tp"]) == ((4 * m, 9 * m) if stage == 0 else (7 * m, 12 * m))
        assert {c.kind for c in rt.steps[0].collectives if c.stream == "tp"} == {"all_reduce"}
        assert entries["dp"] == len(rules.dp_buckets(cfg, stage)) >= 1
        assert entries["emb"] == 1  # tied embeddings: first and last stage (both stages here)
        assert set(entries) == {"pp", "tp", "dp", "emb"}


VARIANTS = [
    dict(tp=2, pp=4, dp=2, layers=8, m=5, tied=True),
    dict(tp=2, pp=2, dp=2, layers=8, m=4, virtual_stages=2, tied=True),  # interleaved
    dict(tp=2, pp=2, dp=4, layers=4, m=2, sequence_parallel=True, zero=1, ep=2,
         moe=MoE(experts=4, top_k=2, expert_ffn_hidden=1024, routing_skew=1.0)),  # MoE, skewed routing
    dict(tp=2, pp=2, dp=2, layers=4, m=2, cp=2, zero=3, overlap_grad_reduce=False),  # context parallel, FSDP
]


@pytest.mark.parametrize("kw", VARIANTS)
def test_group_members_list_the_groups_collectives_in_the_same_order(kw):
    wl = build_workload(tiny(**kw))
    seq: dict[tuple[int, ...], dict[int, list]] = defaultdict(dict)
    for rt in wl.ranks:
        per: dict[tuple[int, ...], list] = defaultdict(list)
        for c in rt.steps[0].collectives:
            assert rt.rank in c.group_ranks and list(c.group_ranks) == sorted(c.group_ranks)
            # under skewed routing each EP rank sends what its experts got: all-to-all sizes differ by rank
            size = None if c.kind == "all_to_all" else c.size_bytes
            per[c.group_ranks].append((c.kind, size, c.count, c.stream, c.start_us, c.duration_us))
        for g, calls in per.items():
            seq[g][rt.rank] = calls
    for g, by_rank in seq.items():
        assert set(by_rank) == set(g), g  # every member lists the group
        first = by_rank[g[0]]
        for r in g:
            assert by_rank[r] == first, (g, r)  # same collectives, same order, same start and duration


def test_nominal_step_time_pp2_by_hand():
    """pp 2, tp 1, dp 1, 2 micro-batches, stages on two servers (400 Gbit/s between them)."""
    cfg = tiny(pp=2, layers=4, m=2, gpus_per_server=1)
    tokens = 1024

    def us(flops: float) -> float:
        return flops / (H100_PEAK * 0.5) * 1e6

    f0 = sum(us(model.layer_flops(cfg, i, tokens, "fwd")) for i in (0, 1))
    b0 = sum(us(model.layer_flops(cfg, i, tokens, "bwd")) for i in (0, 1))
    f1 = sum(us(model.layer_flops(cfg, i, tokens, "fwd")) for i in (2, 3)) + us(model.head_flops(cfg, tokens, "fwd"))
    b1 = sum(us(model.layer_flops(cfg, i, tokens, "bwd")) for i in (2, 3)) + us(model.head_flops(cfg, tokens, "bwd"))
    p = 1 * 1024 * 1024 * 2 * 8 / 400e9 * 1e6  # one bf16 activation (micro-batch x seq x hidden) at 400 Gbit/s
    # the optimizer: 30 bytes per parameter at HBM bandwidth; stage 0 holds the word and (GPT-style) position
    # embeddings, stage 1 the final LayerNorm (weight, bias) and the untied output layer
    h, vocab, seq = 1024, 32768, 1024
    opt0 = 30 * (vocab * h + seq * h + model.layer_params(cfg, 0) + model.layer_params(cfg, 1)) / H100_HBM * 1e6
    opt1 = 30 * (model.layer_params(cfg, 2) + model.layer_params(cfg, 3) + 2 * h + vocab * h) / H100_HBM * 1e6
    # stage 0: F0, send a0 | F1, {send a1, recv g0} | B0, recv g1 | B1;  stage 1: recv a0 | F0 B0 | {a1, g0} | F1 B1 | g1
    t_a0 = f0 + p                                   # stage 1 waits for it from the start
    t_b1_0 = t_a0 + f1 + b1                         # stage 1 ends B0 and offers {a1, g0}
    e = max(2 * f0 + p, t_b1_0) + 2 * p             # the batch: a1 then g0, one after the other
    g = max(e + b0, e + f1 + b1)                    # g1 starts when stage 0 has done B0 and stage 1 B1
    end0 = g + p + b0 + opt0
    end1 = g + p + opt1
    wl = build_workload(cfg)
    d0, d1 = (wl.ranks[r].steps[0].duration_us for r in (0, 1))
    assert d0 == pytest.approx(end0, rel=1e-9)
    assert d1 == pytest.approx(end1, rel=1e-9)
    s0 = wl.ranks[0].steps[0]
    assert s0.compute_us == pytest.approx(2 * f0 + 2 * b0 + opt0, rel=1e-9)
    assert [c.duration_us for c in s0.collectives] == pytest.approx([p] * 4)
    assert wl.training is not None
    assert wl.training.mfu(max(end0, end1)) == pytest.approx(
        model.model_flops_per_step(cfg) / (max(end0, end1) * 1e-6 * 2 * H100_PEAK))


def test_steps_start_at_the_slowest_ranks_end():
    cfg = tiny(pp=2, layers=4, m=2).model_copy(update={"steps": 3})
    wl = build_workload(cfg)
    assert [s.number for s in wl.ranks[0].steps] == [0, 1, 2]
    for rt in wl.ranks:
        assert [s.duration_us for s in rt.steps] == [rt.steps[0].duration_us] * 3


def _flat(pairs):
    return [x for pair in pairs for x in pair]


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, dp=2, m=3, tied=True),
                                dict(tp=1, pp=4, dp=2, layers=8, m=6, overlap_grad_reduce=False),
                                dict(tp=2, pp=4, dp=2, layers=8, m=6, steps=2,
                                     stragglers=Stragglers(jitter_cv=0.2, jitter_per="microbatch", slow_ranks=[3]))]
                         + VARIANTS)
def test_composing_with_the_recorded_durations_gives_the_recorded_timeline(kw):
    wl = build_workload(tiny(**kw))
    for rt in wl.ranks:
        for step in rt.steps:
            tl = metrics.compose_step(step)
            assert _flat(tl.compute) == pytest.approx(_flat(step.compute))
            assert _flat(tl.collectives) == pytest.approx(_flat((c.start_us, c.end_us) for c in step.collectives))
            assert tl.end_us == pytest.approx(step.duration_us)
            times = metrics.step_times(tl)
            metrics.check_step_identity(times, tolerance_us=1e-3)
            assert times.step_us == pytest.approx(step.duration_us)


def test_interleaved_order_pp2_v2_m4():
    """Megatron's interleaved schedule: virtual micro-batch k runs chunk (k mod 4) // 2 (backward: 1 - that) of
    micro-batch (k // 4) x 2 + k mod 2; warm-up (pp - stage - 1) x 2 + (v - 1) x pp = 4 on stage 0, 2 on stage 1.
    Tags are F<micro-batch>.<chunk>."""
    cfg = tiny(pp=2, layers=8, m=4, virtual_stages=2)
    expected = {
        0: "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0",
        1: "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
    }
    for stage, want in expected.items():
        assert " ".join(schedule.stage_program(cfg, stage).passes) == want, stage
    # chunk c of stage s holds layers c x 4 + s x 2 .. +1: stage 0 has layers 0, 1, 4, 5
    assert list(model.stage_layers(cfg, 0, 1)) == [4, 5]


def test_interleaved_runs_and_composes():
    cfg = tiny(tp=2, pp=2, dp=2, layers=8, m=4, virtual_stages=2, tied=True)
    wl = build_workload(cfg)
    for rt in wl.ranks:
        entries, counts = _per_stream(rt.steps[0])
        # per micro-batch, activations: stage 0 chunk 0 -> stage 1 chunk 0 -> (wrap) stage 0 chunk 1 -> stage 1
        # chunk 1 (the loss), and the gradients back the same three hops; pp 2: all on one pair of ranks
        assert entries["pp"] == 4 * (3 + 3)
        # per chunk and micro-batch: forward 1 entry, backward 2 (attention, MLP); the first stage's embedding (1 a
        # micro-batch) or the last stage's loss (3) and output layer (1)
        stage = cfg.grid.coords(rt.rank)["pp"]
        assert entries["tp"] == 2 * 3 * 4 + (1 * 4 if stage == 0 else 4 * 4)
        tl = metrics.compose_step(rt.steps[0])
        assert tl.end_us == pytest.approx(rt.steps[0].duration_us)


def test_interleaved_needs_micro_batches_divisible_by_pp():
    with pytest.raises(TraceError, match="multiple of parallel.pp"):
        build_workload(tiny(pp=2, layers=4, m=3, virtual_stages=2))


def test_cli_workload_llm_and_trace_show_run(capsys):
    assert main(["workload", "llm", "gpt3-175b"]) == 0
    out = capsys.readouterr().out
    assert "MFU" in out and "bubble" in out and "tp all_reduce" in out
    assert main(["trace", "show", "llm:gpt3-175b"]) == 0
    assert "1024 in the trace" in capsys.readouterr().out


@pytest.mark.parametrize("kw", [VARIANTS[0], VARIANTS[2]])
def test_running_one_tp_rank_per_group_gives_every_ranks_full_timeline(kw, monkeypatch):
    cfg = tiny(**kw)
    mult = schedule.compute_multipliers(cfg)
    assert schedule._tp_symmetric(cfg, mult)
    short = schedule.rank_traces(cfg)
    monkeypatch.setattr(schedule, "_tp_symmetric", lambda cfg, mult: False)
    full = schedule.rank_traces(cfg)
    assert short[1] == full[1]
    for a, b in zip(short[0], full[0]):
        assert a.rank == b.rank
        assert a.steps == b.steps  # compute, durations and every collective (group, start, duration) equal


def test_skewed_all_to_all_lasts_as_long_as_its_largest_send_buffer():
    cfg = tiny(**VARIANTS[2])  # ep 2 inside one server (NVLink 3600 Gbit/s), routing_skew 1
    wl = build_workload(cfg)
    by_call: dict[tuple, list] = defaultdict(list)
    for rt in wl.ranks:
        k: dict[tuple, int] = defaultdict(int)
        for c in rt.steps[0].collectives:
            if c.kind == "all_to_all":
                by_call[(c.group_ranks, k[c.group_ranks])].append(c)
                k[c.group_ranks] += 1
    assert by_call
    skewed = 0
    for (group, _), calls in by_call.items():
        assert len(calls) == len(group) == 2
        sizes = [c.size_bytes * c.count for c in calls]
        skewed += len(set(sizes)) > 1
        want = max(sizes) * (2 - 1) / 2 * 8 / 3600e9 * 1e6  # all-to-all busbw factor (n-1)/n
        for c in calls:
            assert c.duration_us == pytest.approx(want, rel=1e-9)
    assert skewed  # the skew made the EP ranks' buffers differ somewhere


def test_training_info():
    cfg = tiny(pp=2, layers=4, m=2)
    info = build_workload(cfg).training
    assert info is not None
    assert info.tokens_per_step == 2 * 1024 and info.world_size == 2 and info.peak_flops_per_gpu == H100_PEAK
    assert info.mfu(1e6) == pytest.approx(info.model_flops_per_step / (1.0 * 2 * H100_PEAK))
    assert "h100" in info.summary()
    with pytest.raises(TraceError, match="step time"):
        info.mfu(0.0)


def test_describe_lines():
    from traffic.llm import describe

    cfg = tiny(pp=2, layers=4, m=4)
    text = describe(cfg)
    lines = dict((ln[:15].strip(), ln[15:]) for ln in text.splitlines())
    assert lines["bubble"] == "(pp - 1) / m = 0.250"  # 1 / 4
    step_us = max(r.steps[0].duration_us for r in build_workload(cfg).ranks)
    assert lines["step"].startswith(f"{step_us / 1e3:.2f} ms nominal")
    widths = {len(ln) - len(ln[15:].lstrip()) for ln in text.splitlines()}
    assert widths == {15}  # every value starts in one column ("compute model" + 2 spaces)
    inter = describe(tiny(pp=2, layers=8, m=4, virtual_stages=2))
    assert "(pp - 1) / (m x virtual_stages) = 0.125" in inter  # 1 / (4 x 2)


def test_interleaved_nominal_step_pp2_v2_m2_by_hand():
    """pp 2, 2 chunks of one layer per stage, 2 micro-batches (= pp: all forwards first), stages on two servers.
    Every transfer is between the same two ranks, so they all take turns on the one "pp" stream; a pass waits
    for its input and sends its output without waiting; two transfers ready at once go in the issuing rank's
    program order (its send before its next receive)."""
    cfg = tiny(pp=2, layers=4, m=2, virtual_stages=2, gpus_per_server=1)
    tokens = 1024

    def us(flops: float) -> float:
        return flops / (H100_PEAK * 0.5) * 1e6

    f = us(model.layer_flops(cfg, 0, tokens, "fwd"))
    b = us(model.layer_flops(cfg, 0, tokens, "bwd"))
    assert all(us(model.layer_flops(cfg, i, tokens, "fwd")) == f for i in range(4))
    hf, hb = us(model.head_flops(cfg, tokens, "fwd")), us(model.head_flops(cfg, tokens, "bwd"))
    p = 1024 * 1024 * 2 * 8 / 400e9 * 1e6
    assert f > p and hb > p  # the order of the ties below
    h, vocab, seq = 1024, 32768, 1024
    opt0 = 30 * (vocab * h + seq * h + model.layer_params(cfg, 0) + model.layer_params(cfg, 2)) / H100_HBM * 1e6
    opt1 = 30 * (model.layer_params(cfg, 1) + model.layer_params(cfg, 3) + 2 * h + vocab * h) / H100_HBM * 1e6
    # both stages: F(c0,0) F(c0,1) F(c1,0) F(c1,1) B(c1,0) B(c1,1) B(c0,0) B(c0,1); s1 chunk 1 has the output layer
    # s0 F00 [0,f] -> a(c0,0) [f, f+p]; s1 F00 ends 2f+p; wrap a(c1,0) [2f+p, 2f+2p], then a(c0,1) to 2f+3p
    # s0 F10 [2f+2p, 3f+2p]; s1 F01 [2f+3p, 3f+3p]; wrap a(c1,1) [3f+3p, 3f+4p], a(c1,0) to 3f+5p
    # s0 F11 [3f+4p, 4f+4p]; s1 F10 ends 4f+5p+hf, a(c1,1) to 4f+6p+hf; F11, B10 on s1:
    t = 5 * f + 6 * p + 2 * hf + b + hb            # s1 sends g(c1,0): [t, t+p]; s1 B11 ends t+b+hb
    r = t + b + hb                                 # s0 B10 ended t+p+b < r: g(c1,1) [r, r+p], wrap g(c0,0) to r+2p
    # s0 B11 [r+p, r+p+b]; s1 B00 [r+2p, r+2p+b]; g(c0,0) [r+2p+b, r+3p+b], wrap g(c0,1) to r+4p+b
    # s0 B00 [r+3p+b, r+3p+2b]; s1 B01 [r+4p+b, r+4p+2b], g(c0,1) [r+4p+2b, r+5p+2b]; s0 B01 after it
    end0 = r + 5 * p + 3 * b + opt0
    end1 = r + 5 * p + 2 * b + opt1
    wl = build_workload(cfg)
    assert wl.ranks[0].steps[0].duration_us == pytest.approx(end0, rel=1e-9)
    assert wl.ranks[1].steps[0].duration_us == pytest.approx(end1, rel=1e-9)


def test_describe_groups_line():
    from traffic.llm import describe

    # tp 2 x pp 2 x dp 2 on servers of 2: tp groups (0,1), (2,3), ... inside; dp (0,2) and pp (0,4) across
    text = describe(tiny(tp=2, pp=2, dp=2, layers=4, m=2, gpus_per_server=2))
    line = next(ln for ln in text.splitlines() if ln.startswith("groups"))
    assert line[15:] == "tp 4 x 2 (NVLink), dp 4 x 2 (network), pp 4 x 2 (network)"
