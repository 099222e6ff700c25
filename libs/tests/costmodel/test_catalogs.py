"""Model and hardware catalogs: published sizes, KV bytes per token, lookups and their errors."""

import pytest
from llmfleet.costmodel import (
    HARDWARE_CATALOG,
    MODEL_CATALOG,
    UnknownHardware,
    UnknownModel,
    arch_from_hf_config,
    hardware,
    local_cpu,
    model_arch,
)
from llmfleet.kvblocks.shapes import KvShape


def test_kv_bytes_per_token_mha_and_gqa():
    assert model_arch("llama2-7b").kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524288
    assert model_arch("llama3-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131072
    assert model_arch("llama2-7b").kv_shape == KvShape(32, 32, 128, "float16")


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("llama2-7b", 6.74),
        ("llama2-13b", 13.0),
        ("llama2-70b", 69.0),
        ("llama3-8b", 8.03),
        ("llama3-70b", 70.6),
        ("mistral-7b", 7.24),
        ("qwen2-7b", 7.62),
        ("opt-6.7b", 6.66),
    ],
)
def test_param_counts_match_published(name, billions):
    assert model_arch(name).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_llama2_7b_exact_params_and_weight_bytes():
    arch = model_arch("llama2-7b")
    assert arch.params == 6_738_415_616
    assert arch.weight_bytes == 2 * arch.params


def test_chatglm2_6b_is_multi_query_with_two_kv_groups():
    arch = model_arch("ChatGLM2-6B")
    assert (arch.num_layers, arch.hidden_size, arch.num_kv_heads, arch.head_dim) == (28, 4096, 2, 128)
    assert (arch.ffn_size, arch.vocab_size) == (13696, 65024)
    # 2 (K, V) × 28 layers × 2 groups × 128 × 2 bytes: 28 KB a token, against Llama-2-7B's 512 KB
    assert arch.kv_bytes_per_token == 28_672
    assert model_arch("llama2-7b").kv_bytes_per_token == 524_288
    # q (4096) + k, v (2 × 256) biases on the qkv projection only: 6.24 B parameters, as published
    assert arch.params == 6_243_584_000


def test_lookup_is_forgiving_and_errors_list_names():
    assert model_arch("Llama-2-7B") is MODEL_CATALOG["llama2-7b"]
    assert hardware("A100-80GB") is HARDWARE_CATALOG["a100-80gb"]
    assert hardware("H100 SXM") is HARDWARE_CATALOG["h100"]
    with pytest.raises(UnknownModel) as e:
        model_arch("gpt-5")
    assert "llama2-7b" in str(e.value) and "tiny-llama" in str(e.value)
    assert isinstance(e.value, KeyError)
    with pytest.raises(UnknownHardware) as e2:
        hardware("tpu-v5")
    assert "a100-40gb" in str(e2.value) and "cpu" in str(e2.value)


def test_catalog_contents():
    assert {"a100-40gb", "a100-80gb", "a800", "h100", "h200", "l4", "rtx-4090", "v100", "cpu"} <= set(
        HARDWARE_CATALOG
    )
    assert {"tiny-llama", "tiny-qwen2", "tiny-mistral"} <= set(MODEL_CATALOG)


def test_arch_from_hf_config_dict_matches_catalog():
    llama = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": False,
    }
    assert arch_from_hf_config(llama, "float16", name="llama2-7b") == model_arch("llama2-7b")
    opt = {
        "model_type": "opt",
        "hidden_size": 4096,
        "ffn_dim": 16384,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
    }
    assert arch_from_hf_config(opt, "float16", name="opt-6.7b") == model_arch("opt-6.7b")


def test_tiny_models_match_engine_configs():
    transformers = pytest.importorskip("transformers")
    tiny = {"tiny-llama": ("llama", 64, 256, 2), "tiny-qwen2": ("qwen2", 96, 256, 3)}
    for name, (mt, hidden, ffn, layers) in tiny.items():
        cfg = transformers.AutoConfig.for_model(
            mt,
            vocab_size=512,
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=2048,
            tie_word_embeddings=mt == "qwen2",
        )
        assert arch_from_hf_config(cfg, "float32", name=name) == model_arch(name)


def test_local_cpu_measures_positive_rates():
    hw = local_cpu(size=128, copy_mib=4, repeats=1)
    assert hw.peak_flops > 0 and hw.mem_bandwidth > 0 and hw.name == "cpu-local"
