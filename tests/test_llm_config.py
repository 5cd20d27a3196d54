"""traffic.llm.config: presets, world sizes, overrides, YAML files, and bad input as TraceError naming it."""
from __future__ import annotations

import pytest
import yaml

from traffic.llm.config import PRESETS, LLMConfig, load_config, parse_config
from traffic.workload import TraceError

# (layers, hidden, ffn_hidden, heads, kv_heads, vocab, seq_len) as the papers / model cards publish them
PUBLISHED = {
    "gpt3-175b": (96, 12288, 49152, 96, 96, 51200, 2048),
    "llama3-70b": (80, 8192, 28672, 64, 8, 128256, 8192),
    "llama3-405b": (126, 16384, 53248, 128, 8, 128256, 8192),
    "mixtral-8x22b": (56, 6144, 16384, 48, 8, 32768, 4096),
    "deepseek-v3": (64, 7168, 18432, 128, 128, 129280, 4096),  # 64 layers, not 61: see docs
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_each_preset_has_its_published_shape_on_1024_gpus(name):
    cfg = load_config(name)
    m = cfg.model
    assert (m.layers, m.hidden, m.ffn_hidden, m.heads, m.kv_heads, m.vocab, m.seq_len) == PUBLISHED[name]
    p = cfg.parallel
    assert cfg.world_size == p.tp * p.cp * p.dp * p.pp == 1024
    assert cfg.grid.world == 1024
    assert cfg.name == name


def test_micro_batches_are_the_global_batch_over_micro_batch_times_dp():
    assert load_config("gpt3-175b").micro_batches == 1536 // (1 * 16)  # 96
    assert load_config("llama3-70b").micro_batches == 512 // (1 * 32)  # 16
    assert load_config("deepseek-v3").micro_batches == 4096 // (1 * 64)  # 64


def test_moe_presets():
    mix = load_config("mixtral-8x22b").model.moe
    assert mix is not None and (mix.experts, mix.top_k, mix.dense_layers) == (8, 2, 0)
    ds = load_config("deepseek-v3")
    assert ds.model.moe is not None
    assert (ds.model.moe.experts, ds.model.moe.top_k, ds.model.moe.shared_experts, ds.model.moe.dense_layers,
            ds.model.moe.expert_ffn_hidden) == (256, 8, 1, 3, 2048)
    # EP64 over the dense dp 64 with tp 1, pp 16: edp = 1024 / (1 x 64 x 16) = 1
    assert ds.grid.edp == 1


def test_gpt3_grid_is_megatron_order():
    cfg = load_config("gpt3-175b")
    assert cfg.grid.groups("tp")[0] == tuple(range(8))
    # dp is the next axis: stride tp = 8; pp strides tp x dp = 128
    assert cfg.grid.group_of("dp", 0) == tuple(range(0, 128, 8))
    assert cfg.grid.group_of("pp", 0) == tuple(range(0, 1024, 128))


def test_overrides_set_dotted_keys_and_name_the_job_by_its_spec():
    spec = "gpt3-175b,parallel.pp=16,parallel.dp=8,compute.gpu=a100,stragglers.slow_ranks=[3,7],micro_batch=2"
    cfg = load_config(spec)
    assert (cfg.parallel.pp, cfg.parallel.dp, cfg.world_size) == (16, 8, 8 * 16 * 8)
    assert cfg.compute.gpu == "a100"
    assert cfg.stragglers.slow_ranks == [3, 7]
    assert cfg.micro_batches == 1536 // (2 * 8)
    assert cfg.name == spec
    assert load_config("gpt3-175b,name=mine,model.layers=16").name == "mine"
    # values are YAML scalars: floats and booleans
    cfg = load_config("llama3-70b,stragglers.jitter_cv=0.05,parallel.overlap_grad_reduce=false")
    assert cfg.stragglers.jitter_cv == 0.05 and cfg.parallel.overlap_grad_reduce is False
    assert load_config("llama3-70b,stragglers.jitter_cv=5e-2").stragglers.jitter_cv == 0.05  # YAML 1.1: a string


def test_a_preset_written_as_yaml_loads_back_the_same(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(PRESETS["mixtral-8x22b"].model_dump(mode="json"), sort_keys=False))
    assert load_config(str(path)) == PRESETS["mixtral-8x22b"]
    cfg = load_config(f"{path},parallel.ep=4")
    assert cfg.parallel.ep == 4 and cfg.model.moe == PRESETS["mixtral-8x22b"].model.moe


@pytest.mark.parametrize("spec, words", [
    ("gpt4", ["unknown preset", "gpt4", "gpt3-175b"]),
    ("", ["no preset"]),
    ("gpt3-175b,parallel.xx=1", ["unknown key", "parallel.xx"]),
    ("gpt3-175b,bogus=1", ["unknown key", "bogus"]),
    ("gpt3-175b,parallel.tp", ["not key=value"]),
    ("gpt3-175b,parallel.tp=true", ["parallel.tp", "integer"]),
    ("gpt3-175b,parallel.tp=0", ["parallel.tp"]),
    ("gpt3-175b,compute.gpu=v100", ["compute.gpu"]),
    ("gpt3-175b,dtype=int8", ["dtype"]),
    ("llama3-70b,parallel.tp=3", ["parallel.tp", "model.heads"]),
    ("gpt3-175b,parallel.pp=5", ["model.layers", "parallel.pp"]),
    ("gpt3-175b,global_batch=1000", ["global_batch", "micro_batch"]),
    ("gpt3-175b,parallel.ep=2", ["parallel.ep", "no experts"]),
    ("mixtral-8x22b,parallel.ep=16,parallel.dp=128,parallel.pp=4", ["model.moe.experts", "parallel.ep"]),
    ("mixtral-8x22b,parallel.ep=3", ["parallel.ep"]),
    ("mixtral-8x22b,model.moe.top_k=9", ["model.moe.top_k", "9"]),
    ("gpt3-175b,stragglers.slow_ranks=[1024]", ["stragglers.slow_ranks", "1024"]),
    ("gpt3-175b,stragglers.slow_servers=[128]", ["stragglers.slow_servers", "128"]),
    ("gpt3-175b,model.moe.experts=8", ["model.moe", "top_k"]),
    ("gpt3-175b,parallel.virtual_stages=5", ["model.layers", "virtual_stages"]),
    ("llama3-70b,parallel.cp=3", ["parallel.cp", "model.seq_len"]),
    ("gpt3-175b,parallel.sequence_parallel=[1,2]", ["parallel.sequence_parallel"]),
    ("missing.yaml", ["missing.yaml", "no such config file"]),
])
def test_bad_specs_are_trace_errors_naming_the_problem(spec, words):
    with pytest.raises(TraceError) as exc:
        load_config(spec)
    for w in words:
        assert w in str(exc.value)


def test_bad_files_are_trace_errors(tmp_path):
    not_map = tmp_path / "list.yaml"
    not_map.write_text("- 1\n- 2\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [1, 2\n")
    extra = tmp_path / "extra.yaml"
    data = PRESETS["gpt3-175b"].model_dump(mode="json")
    data["model"]["dropout"] = 0.1
    extra.write_text(yaml.safe_dump(data))
    for path, word in ((not_map, "mapping"), (broken, "not YAML"), (extra, "model.dropout")):
        with pytest.raises(TraceError) as exc:
            load_config(str(path))
        assert str(path) in str(exc.value) and word in str(exc.value)


def test_parse_config_names_the_source_and_refuses_non_mappings():
    with pytest.raises(TraceError, match="here: a config is a mapping"):
        parse_config([1], "here")
    with pytest.raises(TraceError, match="here: .*micro_batch"):
        data = PRESETS["gpt3-175b"].model_dump(mode="python")
        del data["micro_batch"]
        parse_config(data, "here")
    assert isinstance(parse_config(PRESETS["gpt3-175b"].model_dump(mode="python")), LLMConfig)
