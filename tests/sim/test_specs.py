"""Models from a Hugging Face config.json, GPUs from a spec file, and the datasheet GPUs."""
import json

import pytest

from sim import HARDWARE, SimConfig, get_hardware, get_model, load_workload, simulate, step_breakdown

# Mistral-7B-v0.1's config.json (the fields the simulator reads, and a few it does not)
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16", "_name_or_path": "mistralai/Mistral-7B-v0.1"}
A100 = {"name": "my-a100", "peak_tflops": 312, "vector_tflops": 19.5, "memory_bandwidth_gbs": 2039, "memory_gib": 80,
        "interconnect_gbs": 300, "pcie_gbs": 32, "num_sms": 108}


def test_hf_config_gives_the_shapes_and_parameter_count(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL))
    for where in (tmp_path, tmp_path / "config.json"):
        m = get_model(str(where))
        assert (m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size) == (32, 32, 8, 128, 14336)
        assert m.num_params == pytest.approx(7.24e9, rel=0.005)  # Mistral-7B: 7.24 B
        assert m.max_model_len == 32768 and m.name == "mistralai/mistral-7b-v0.1"
    # a Llama config reproduces the catalog's Llama-3-8B
    llama3 = dict(MISTRAL, model_type="llama", vocab_size=128256, max_position_embeddings=8192)
    (tmp_path / "config.json").write_text(json.dumps(llama3))
    assert get_model(str(tmp_path)).num_params == pytest.approx(get_model("llama-3-8b").num_params, rel=1e-3)


def test_a_qwen_1_config_gives_the_mlp_its_code_builds(tmp_path):
    """Qwen-72B's config.json (model_type "qwen") says intermediate_size 49152 and kv_channels 128; its MLP's
    input projections are 24576 wide each: the shapes Vidur profiled (the catalog's qwen-72b)."""
    qwen = {"architectures": ["QWenLMHeadModel"], "model_type": "qwen", "hidden_size": 8192, "intermediate_size": 49152,
            "kv_channels": 128, "num_attention_heads": 64, "num_hidden_layers": 80, "vocab_size": 152064,
            "max_position_embeddings": 32768, "seq_length": 32768, "tie_word_embeddings": False, "no_bias": True,
            "_name_or_path": "Qwen/Qwen-72B"}
    (tmp_path / "config.json").write_text(json.dumps(qwen))
    m, catalog = get_model(str(tmp_path)), get_model("qwen/qwen-72b")
    shape = ("num_layers", "num_heads", "num_kv_heads", "head_dim", "hidden_size", "intermediate_size", "vocab_size",
             "max_model_len")
    assert [getattr(m, k) for k in shape] == [getattr(catalog, k) for k in shape]
    assert m.intermediate_size == 24576 and m.num_params == pytest.approx(72.29e9, rel=1e-3)


def test_hf_config_runs_in_the_simulator(tmp_path, azure_conv):
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL))
    r = simulate(load_workload(azure_conv, num_requests=50), SimConfig(model=str(tmp_path), hardware="l40s"))
    assert r.summary()["num_requests"] == 50


def test_bad_hf_configs(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(dict(MISTRAL, model_type="gpt2")))
    with pytest.raises(ValueError, match=r"model_type='gpt2': expected a Llama-family model, one of \['llama'"):
        get_model(str(p))
    p.write_text(json.dumps(dict(MISTRAL, num_local_experts=8)))
    with pytest.raises(ValueError, match="mixture of experts"):
        get_model(str(p))
    p.write_text(json.dumps({k: v for k, v in MISTRAL.items() if k != "intermediate_size"}))
    with pytest.raises(ValueError, match=r"intermediate_size=None: expected integers >= 1"):
        get_model(str(p))
    with pytest.raises(FileNotFoundError, match="missing.json"):
        get_model(str(tmp_path / "missing.json"))


def test_hardware_spec_file(tmp_path):
    p = tmp_path / "gpu.yaml"
    p.write_text(json.dumps(A100))
    hw = get_hardware(str(p))
    assert hw.name == "my-a100" and hw.peak_flops == HARDWARE["a100-80gb"].peak_flops and hw.num_sms == 108
    assert hw.cta_cluster == 1  # optional: no thread block clusters unless the file says so
    # the same datasheet as the catalog's A100, but not the A100 the profiles measured: datasheet constants
    mine, fitted = (step_breakdown("llama-2-7b", h, num_prefill_tokens=1024) for h in (str(p), "a100-80gb"))
    assert mine["total"] == pytest.approx(fitted["total"], rel=0.15) and mine["total"] != fitted["total"]
    p.write_text(json.dumps({k: v for k, v in A100.items() if k != "num_sms"} | {"tflops": 1}))
    with pytest.raises(ValueError, match=r"unknown \['tflops'\], missing \['num_sms'\]: expected keys"):
        get_hardware(str(p))
    p.write_text(json.dumps(A100 | {"cta_cluster": 2}))
    assert get_hardware(str(p)).cta_cluster == 2
    for bad in (0, 1.5, True):
        p.write_text(json.dumps(A100 | {"cta_cluster": bad}))
        with pytest.raises(ValueError, match=rf"cta_cluster={bad!r}: expected an integer >= 1"):
            get_hardware(str(p))
    p.write_text(json.dumps(A100 | {"memory_bandwidth_gbs": -1}))
    with pytest.raises(ValueError, match=r"memory_bandwidth_gbs=-1: expected numbers > 0"):
        get_hardware(str(p))
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        get_hardware(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("gpu", ["a40", "l40s", "a10g", "b200", "mi300x"])
def test_datasheet_gpus_order_as_their_bandwidth_and_flops(gpu):
    """Decode is bound by memory bandwidth, a long prefill by FLOP/s: each new GPU lands where its
    datasheet puts it relative to the A100 the profiles measured."""
    hw, a100 = get_hardware(gpu), get_hardware("a100-80gb")
    dec, dec_a = (step_breakdown("llama-2-7b", h, num_decode_tokens=1, decode_context_sum=10)["non_attention"]
                  for h in (gpu, "a100-80gb"))
    pre, pre_a = (step_breakdown("llama-2-7b", h, num_prefill_tokens=4096)["non_attention"] for h in (gpu, "a100-80gb"))
    assert dec / dec_a == pytest.approx(a100.memory_bandwidth / hw.memory_bandwidth, rel=0.3)
    assert pre / pre_a == pytest.approx(a100.peak_flops / hw.peak_flops, rel=0.3)
