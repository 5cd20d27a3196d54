"""The LLM training config's records (pydantic, validated): model shape, parallelism, compute, stragglers.

`traffic.llm.config` re-exports them with `load_config`; `traffic.llm.presets` builds its presets from
them. Constructing an `LLMConfig` directly raises pydantic's `ValidationError` for a bad field and
`TraceError` for sizes that do not fit together; `traffic.llm.config.parse_config` turns both into a
`TraceError` naming the field.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traffic.parallel import ParallelError, ParallelGrid
from traffic.workload import TraceError

Pos = Field(ge=1)
One = Field(default=1, ge=1)


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class MoE(_Record):
    """Mixture-of-experts layers: `experts` routed experts of `expert_ffn_hidden`, each token goes to `top_k`."""

    experts: int = Pos
    top_k: int = Pos
    capacity_factor: float = Field(default=1.0, gt=0)
    expert_ffn_hidden: int = Pos
    dense_layers: int = Field(default=0, ge=0)  # the first k layers are dense
    shared_experts: int = Field(default=0, ge=0)
    routing_skew: float = Field(default=0.0, ge=0)  # 0: uniform; > 0: seeded Zipf-like skew over experts
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> MoE:
        if self.top_k > self.experts:
            raise TraceError(f"model.moe.top_k: {self.top_k} is more than the {self.experts} experts")
        return self


class Model(_Record):
    """A decoder-only transformer. `gated_ffn`: the Llama family's SwiGLU MLP (3 matrices), no linear biases,
    RMSNorm, rotary positions; otherwise GPT-3's GELU MLP (2 matrices) with biases, LayerNorm and learned
    position embeddings."""

    layers: int = Pos
    hidden: int = Pos
    ffn_hidden: int = Pos
    heads: int = Pos
    kv_heads: int = Pos
    vocab: int = Pos
    seq_len: int = Pos
    gated_ffn: bool
    tied_embeddings: bool
    moe: MoE | None = None

    @model_validator(mode="after")
    def _check(self) -> Model:
        if self.hidden % self.heads:
            raise TraceError(f"model.hidden: {self.hidden} is not a multiple of model.heads {self.heads}")
        if self.heads % self.kv_heads:
            raise TraceError(f"model.kv_heads: {self.kv_heads} does not divide model.heads {self.heads}")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise TraceError(f"model.moe.dense_layers: {self.moe.dense_layers} leaves no MoE layer of the "
                             f"{self.layers} layers")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe is not None and layer >= self.moe.dense_layers


class Parallel(_Record):
    """Parallel sizes; the dense grid is tp-cp-dp-pp (Megatron-Core's order), the expert grid etp-ep-edp-pp."""

    tp: int = One
    cp: int = One
    pp: int = One
    dp: int = One
    ep: int = One
    etp: int | None = Field(default=None, ge=1)  # None: = tp
    sequence_parallel: bool = False
    virtual_stages: int = One  # interleaved 1F1B model chunks per stage
    zero: int = Field(default=0, ge=0, le=3)  # 0 DDP; 1/2 distributed optimizer; 3 FSDP
    bucket_params: int | None = Field(default=None, ge=1)  # None: Megatron-Core's default
    # the gradients' dtype in the DP reduction: fp32 main grads (--accumulate-allreduce-grads-in-fp32), bf16, or
    # fp16 (Megatron-LM 2021 with --fp16 reduced in fp16 unless told otherwise)
    grad_reduce_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # Megatron-LM 2021's scatter/gather of pipeline tensors (`--scatter-gather-tensors-in-pipeline`, its default
    # from 2021-02-16; Narayanan et al. SC'21 section 4.1; Megatron-Core dropped it): without SP each TP rank sends
    # 1 / tp of the activation (or its grad) and the receiving stage all-gathers it over TP
    pipeline_scatter_gather: bool = False
    overlap_grad_reduce: bool = True
    # a column-parallel linear's backward TP collectives run under its GEMMs (Megatron-Core and Transformer Engine:
    # the SP input all-gather under the dgrad GEMM, the input grad's all-reduce or reduce-scatter under the wgrad
    # GEMM); False: every TP collective blocks compute
    tp_comm_overlap_bwd: bool = True

    @property
    def expert_tp(self) -> int:
        return self.tp if self.etp is None else self.etp


class Compute(_Record):
    """The compute model: a GEMM-FLOP count at `kernel_efficiency` of the GPU's dense bf16 peak."""

    gpu: Literal["a100", "h100", "h200", "b200"] = "h100"
    # kernels' share of peak while they run (docs/workloads.md: "compute model" says why 0.5)
    kernel_efficiency: float = Field(default=0.5, gt=0, le=1)
    recompute: Literal["none", "selective", "full"] = "none"
    # full recompute as Megatron-Core's --recompute-method / --recompute-num-layers: "uniform" checkpoints every
    # layer (in groups of recompute_num_layers; each layer's forward runs once more in backward), "block" only the
    # first recompute_num_layers layers of each pipeline stage's model chunk (`transformer_block.py`,
    # `_checkpointed_forward`)
    recompute_method: Literal["uniform", "block"] = "uniform"
    recompute_num_layers: int = Field(default=1, ge=1)
    # compute running under an overlapped NCCL kernel is this much slower (the kernel takes SMs); 0: not at all
    overlap_sm_slowdown: float = Field(default=0.0, ge=0)
    # a measured trace of this job (any format `traffic.traces.load` reads: Kineto, Chakra, an AICB log with
    # computation rows): the kernel efficiency is then measured from it, not assumed (docs/workloads.md)
    profile: str | None = None
    profile_rank: int = Field(default=0, ge=0)  # the job's rank the profile recorded


class Stragglers(_Record):
    jitter_cv: float = Field(default=0.0, ge=0)
    jitter_per: Literal["step", "microbatch"] = "step"
    slow_ranks: list[int] = Field(default_factory=list)
    slow_servers: list[int] = Field(default_factory=list)
    slow_factor: float = Field(default=1.1, gt=0)
    seed: int = 0


class LLMConfig(_Record):
    """One training job: the model, its parallelism, batch, the GPUs and the compute/straggler models."""

    name: str
    model: Model
    parallel: Parallel
    micro_batch: int = Pos
    global_batch: int = Pos
    dtype: Literal["bfloat16", "float16"] = "bfloat16"
    steps: int = Field(default=1, ge=1)
    gpus_per_server: int = Field(default=8, ge=1)
    nvlink_gbps: float = Field(default=3600.0, gt=0)
    nic_gbps: float = Field(default=400.0, gt=0)  # per GPU: the generator's own timeline's network
    compute: Compute = Field(default_factory=Compute)
    stragglers: Stragglers = Field(default_factory=Stragglers)

    @property
    def world_size(self) -> int:
        p = self.parallel
        return p.tp * p.cp * p.dp * p.pp

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step per data-parallel replica (the pipeline's m)."""
        return self.global_batch // (self.micro_batch * self.parallel.dp)

    @property
    def grid(self) -> ParallelGrid:
        p = self.parallel
        return ParallelGrid(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp, ep=p.ep, etp=p.etp)

    @property
    def dtype_bytes(self) -> int:
        return 2  # bfloat16 and float16

    @model_validator(mode="after")
    def _check(self) -> LLMConfig:
        m, p = self.model, self.parallel
        _divides("parallel.tp", p.tp, "model.heads", m.heads)
        _divides("parallel.tp", p.tp, "model.kv_heads", m.kv_heads)
        _divides("parallel.tp", p.tp, "model.ffn_hidden", m.ffn_hidden)
        if m.vocab % p.tp:
            raise TraceError(f"model.vocab: {m.vocab} is not a multiple of parallel.tp {p.tp} (pad it, as "
                             "Megatron's --make-vocab-size-divisible-by does)")
        chunks = p.pp * p.virtual_stages
        if m.layers % chunks:
            raise TraceError(f"model.layers: {m.layers} do not split evenly into parallel.pp x "
                             f"parallel.virtual_stages = {p.pp} x {p.virtual_stages} model chunks")
        if p.virtual_stages > 1 and p.pp == 1:
            raise TraceError("parallel.virtual_stages: interleaving needs parallel.pp > 1")
        _divides("parallel.cp", p.cp, "model.seq_len", m.seq_len)
        if p.sequence_parallel:
            _divides("parallel.tp", p.tp, "model.seq_len / parallel.cp", m.seq_len // p.cp)
        rows = self.micro_batch * p.dp
        if self.global_batch % rows:
            raise TraceError(f"global_batch: {self.global_batch} is not a multiple of micro_batch x parallel.dp = "
                             f"{self.micro_batch} x {p.dp}")
        if p.virtual_stages > 1 and self.micro_batches % p.pp:
            raise TraceError(f"global_batch: interleaved 1F1B needs the {self.micro_batches} micro-batches to be a "
                             f"multiple of parallel.pp {p.pp}")
        if m.moe is None:
            if p.ep > 1 or p.etp not in (None, p.tp):
                raise TraceError("parallel.ep / parallel.etp: a dense model (no model.moe) has no experts")
        else:
            if m.moe.experts % p.ep:
                raise TraceError(f"model.moe.experts: {m.moe.experts} is not a multiple of parallel.ep {p.ep}")
            if p.expert_tp not in (1, p.tp):
                raise TraceError(f"parallel.etp: only 1 or parallel.tp ({p.tp}) is modelled, got {p.etp}")
            _divides("parallel.etp", p.expert_tp, "model.moe.expert_ffn_hidden", m.moe.expert_ffn_hidden)
            if p.tp > 1 and p.ep > 1 and not p.sequence_parallel:
                raise TraceError("parallel.sequence_parallel: Megatron-Core needs it for MoE with tp > 1 and ep > 1")
        try:
            grid = self.grid
        except ParallelError as exc:
            raise TraceError(f"parallel: {exc}") from None
        for r in self.stragglers.slow_ranks:
            if not 0 <= r < grid.world:
                raise TraceError(f"stragglers.slow_ranks: rank {r} is not in the {grid.world}-rank job")
        servers = -(-grid.world // self.gpus_per_server)
        for s in self.stragglers.slow_servers:
            if not 0 <= s < servers:
                raise TraceError(f"stragglers.slow_servers: server {s} is not one of the job's {servers} servers")
        return self


def _divides(name: str, value: int, of_name: str, of: int) -> None:
    if of % value:
        raise TraceError(f"{name}: {value} does not divide {of_name} {of}")
