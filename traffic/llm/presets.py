"""Preset training jobs: published model shapes on a 1024-GPU layout (docs/workloads.md, "presets").

The shapes are the models' published configs; the parallel layouts and batches are plausible 1024-GPU
choices, each explained in the docs (where a layout was published, it is that one scaled to 1024 GPUs).
"""
from __future__ import annotations

from traffic.llm.schema import Compute, LLMConfig, Model, MoE, Parallel

GPT3_175B = LLMConfig(
    name="gpt3-175b",
    # Brown et al. 2020, Table 2.1; vocab 50257 padded to 51200 as Megatron does (multiple of 128 x 8)
    model=Model(layers=96, hidden=12288, ffn_hidden=4 * 12288, heads=96, kv_heads=96, vocab=51200, seq_len=2048,
                gated_ffn=False, tied_embeddings=True),
    parallel=Parallel(tp=8, pp=8, dp=16),
    micro_batch=1, global_batch=1536,
    compute=Compute(gpu="h100", recompute="selective"),
)

LLAMA3_70B = LLMConfig(
    name="llama3-70b",
    # Llama 3 paper (Dubey et al. 2024), Table 3; layout: NeMo's llama3_70b pre-training recipe (TP4 PP4 CP2), without
    # its 5 virtual stages (parallel.virtual_stages=5 interleaves them)
    model=Model(layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8, vocab=128256, seq_len=8192,
                gated_ffn=True, tied_embeddings=False),
    parallel=Parallel(tp=4, cp=2, pp=4, dp=32, sequence_parallel=True, zero=1),
    micro_batch=1, global_batch=512,
    compute=Compute(gpu="h100"),
)

LLAMA3_405B = LLMConfig(
    name="llama3-405b",
    # Llama 3 paper, Table 3. 126 layers split evenly into 2 power-of-two stages only: TP8 CP2 PP2 (our choice; Meta
    # ran TP8 PP16 with uneven first/last stages); grads and optimizer state sharded (ZeRO-2, as Meta describes) and
    # full recompute, to fit the 25e9 parameters (50 GB bf16) a GPU holds
    model=Model(layers=126, hidden=16384, ffn_hidden=53248, heads=128, kv_heads=8, vocab=128256, seq_len=8192,
                gated_ffn=True, tied_embeddings=False),
    parallel=Parallel(tp=8, cp=2, pp=2, dp=32, sequence_parallel=True, zero=2),
    micro_batch=1, global_batch=512,
    compute=Compute(gpu="h100", recompute="full", recompute_method="uniform", recompute_num_layers=1),
)

MIXTRAL_8X22B = LLMConfig(
    name="mixtral-8x22b",
    # Mixtral-8x22B-v0.1's published config (56 layers, h 6144, 48 heads / 8 KV, expert FFN 16384, vocab 32768);
    # layout ours, after NeMo's Mixtral recipes: TP2 PP8 EP8, distributed optimizer, bf16 grad reduction
    model=Model(layers=56, hidden=6144, ffn_hidden=16384, heads=48, kv_heads=8, vocab=32768, seq_len=4096,
                gated_ffn=True, tied_embeddings=False,
                moe=MoE(experts=8, top_k=2, expert_ffn_hidden=16384)),
    parallel=Parallel(tp=2, pp=8, dp=64, ep=8, sequence_parallel=True, zero=1, grad_reduce_dtype="bfloat16"),
    micro_batch=1, global_batch=1024,
    compute=Compute(gpu="h100", recompute="selective"),
)

DEEPSEEK_V3 = LLMConfig(
    name="deepseek-v3",
    # DeepSeek-V3 technical report (2024): h 7168, 128 heads, dense FFN 18432, 256 routed experts of 2048 + 1
    # shared, top-8, first 3 layers dense, vocab 129280, 4K pre-training sequences. Differences (say so): MLA is
    # replaced by MHA-equivalent projections (128 KV heads of 56), and 64 layers instead of 61 so that DeepSeek's
    # 16 pipeline stages split them evenly. Layout: DeepSeek's PP16 EP64 ZeRO-1, no TP, on 1024 GPUs (DP64).
    model=Model(layers=64, hidden=7168, ffn_hidden=18432, heads=128, kv_heads=128, vocab=129280, seq_len=4096,
                gated_ffn=True, tied_embeddings=False,
                moe=MoE(experts=256, top_k=8, expert_ffn_hidden=2048, dense_layers=3, shared_experts=1)),
    parallel=Parallel(pp=16, dp=64, ep=64, zero=1, grad_reduce_dtype="bfloat16"),
    micro_batch=1, global_batch=4096,
    compute=Compute(gpu="h100"),
)

PRESETS: dict[str, LLMConfig] = {c.name: c for c in (GPT3_175B, LLAMA3_70B, LLAMA3_405B, MIXTRAL_8X22B,
                                                      DEEPSEEK_V3)}
