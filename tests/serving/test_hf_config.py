"""A model given by its Hugging Face ``config.json``: the shape, parameters, KV bytes and tensor parallelism the twin
derives from it, checked against the catalog's own figures, and the errors that name the file and the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tessera.core.errors import InputFileError
from tessera.serving.hf_config import read_hf_config, spec_from_hf_config
from tessera.serving.models import CATALOG, GIB, GRID_MODELS, default_tensor_parallel

# The published config.json of each model, with the keys the twin reads (values as on the Hub).
LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
}
LLAMA2_70B = {**LLAMA3_8B, "num_hidden_layers": 80, "hidden_size": 8192, "num_attention_heads": 64}
LLAMA2_70B |= {"intermediate_size": 28672, "vocab_size": 32000, "torch_dtype": "float16"}
LLAMA2_7B = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"} | {"intermediate_size": 11008}
LLAMA2_7B |= {"vocab_size": 32000, "torch_dtype": "float16"}
BLOOM_176B = {"model_type": "bloom", "n_layer": 70, "hidden_size": 14336, "n_head": 112, "vocab_size": 250880}
BLOOM_176B |= {"torch_dtype": "bfloat16"}  # no KV heads (multi-head), no MLP width (4 x hidden), tied embeddings
MIXTRAL_8X7B = {**LLAMA3_8B, "model_type": "mixtral", "vocab_size": 32000, "num_local_experts": 8}
MIXTRAL_8X7B |= {"num_experts_per_tok": 2}
GPT2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_inner": None}
GPT2 |= {"torch_dtype": "float32"}


def _write(folder: Path, config: dict[str, Any]) -> Path:
    path = folder / "config.json"
    path.write_text(json.dumps(config))
    return path


def test_a_gqa_config_gives_the_catalog_figures_of_that_model(tmp_path: Path) -> None:
    spec = read_hf_config(_write(tmp_path, LLAMA3_8B), "mine")
    catalog = CATALOG["llama3-8b"]
    assert spec.name == "mine"
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim) == (32, 4096, 32, 8, 128)
    assert spec.kv_bytes_per_token == catalog.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2  # GQA: 8 KV heads of 32
    assert spec.params_b == pytest.approx(catalog.params_b, rel=0.005)
    assert spec.tensor_parallel == catalog.tensor_parallel == 1
    assert spec.active_params_b is None and spec.flops_per_token == pytest.approx(2 * spec.params_b * 1e9)


LLAMA2_13B = LLAMA2_7B | {"num_hidden_layers": 40, "hidden_size": 5120, "num_attention_heads": 40}
LLAMA2_13B |= {"intermediate_size": 13824}
CODELLAMA_34B = LLAMA2_70B | {"num_hidden_layers": 48, "intermediate_size": 22016}


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (LLAMA2_7B, "llama2-7b"),
        (LLAMA2_13B, "llama2-13b"),
        (CODELLAMA_34B, "codellama-34b"),
        (LLAMA2_70B, "llama2-70b"),
    ],
)
def test_other_catalog_configs_give_their_catalog_figures(config: dict[str, Any], name: str) -> None:
    spec = spec_from_hf_config(config, "x")
    catalog = CATALOG[name]
    assert spec.params_b == pytest.approx(catalog.params_b, rel=0.005)
    assert spec.kv_bytes_per_token == catalog.kv_bytes_per_token
    assert spec.tensor_parallel == catalog.tensor_parallel


def test_bloom_s_config_defaults_kv_heads_mlp_width_and_tied_embeddings() -> None:
    spec = spec_from_hf_config(BLOOM_176B, "bloom")
    grid = GRID_MODELS["bloom-176b"]
    assert spec.kv_heads == spec.heads == 112 and spec.head_dim == 128
    assert spec.params_b == pytest.approx(grid.params_b, rel=0.001)  # 4 x hidden MLP, one embedding matrix
    assert spec.kv_bytes_per_token == grid.kv_bytes_per_token
    assert spec.tensor_parallel == grid.tensor_parallel == 8


def test_the_default_tensor_parallelism_reproduces_the_catalog_s() -> None:
    for spec in [*CATALOG.values(), *GRID_MODELS.values()]:
        assert default_tensor_parallel(spec.weights_bytes) == spec.tensor_parallel, spec.name
    assert default_tensor_parallel(2000 * GIB) == 8  # never beyond one node


def test_other_architectures_key_spellings() -> None:
    gpt2 = spec_from_hf_config(GPT2, "gpt2")
    assert (gpt2.layers, gpt2.hidden, gpt2.heads, gpt2.head_dim, gpt2.dtype_bytes) == (12, 768, 12, 64, 4)
    assert gpt2.params_b == pytest.approx(0.1244, rel=0.01)  # GPT-2 small: 124M with its tied embeddings
    falcon = {"model_type": "falcon", "num_hidden_layers": 32, "hidden_size": 4544, "num_attention_heads": 71}
    falcon |= {"multi_query": True, "vocab_size": 65024, "torch_dtype": "bfloat16"}
    spec = spec_from_hf_config(falcon, "falcon-7b")
    assert spec.kv_heads == 1 and spec.params_b == pytest.approx(6.92, rel=0.01)


def test_an_explicit_head_dim_and_a_nested_text_config_are_read() -> None:
    text = {**LLAMA3_8B, "head_dim": 256, "num_key_value_heads": 4}
    del text["torch_dtype"]
    spec = spec_from_hf_config({"model_type": "llava", "torch_dtype": "float16", "text_config": text}, "vlm")
    assert spec.head_dim == 256 and spec.kv_heads == 4 and spec.dtype_bytes == 2
    assert spec.kv_bytes_per_token == 2 * 32 * 4 * 256 * 2


def test_a_mixture_of_experts_holds_every_expert_and_runs_its_top_k() -> None:
    spec = spec_from_hf_config(MIXTRAL_8X7B, "mixtral")
    assert spec.params_b == pytest.approx(46.7, rel=0.005)  # Mixtral 8x7B's published totals
    assert spec.active_params_b is not None and spec.active_params_b == pytest.approx(12.9, rel=0.005)
    assert spec.weights_bytes == int(spec.params_b * 1e9 * 2)
    assert spec.flops_per_token == pytest.approx(2 * spec.active_params_b * 1e9)


@pytest.mark.parametrize(
    "key",
    ["num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "torch_dtype", "intermediate_size"],
)
def test_a_missing_needed_key_names_the_file_and_the_key(tmp_path: Path, key: str) -> None:
    path = _write(tmp_path, {k: v for k, v in LLAMA3_8B.items() if k != key})
    with pytest.raises(InputFileError) as caught:
        read_hf_config(path, "mine")
    assert caught.value.path == str(path) and caught.value.field == key
    assert str(caught.value).startswith(f"{path}: {key}: missing")


@pytest.mark.parametrize(
    ("edit", "field", "fragment"),
    [
        ({"num_hidden_layers": 0}, "num_hidden_layers", "whole number >= 1"),
        ({"hidden_size": "4096"}, "hidden_size", "whole number >= 1"),
        ({"num_key_value_heads": True}, "num_key_value_heads", "whole number >= 1"),
        ({"torch_dtype": "int3"}, "torch_dtype", "unknown dtype"),
        ({"quantization_config": {"bits": 4}}, "quantization_config", "not modelled"),
        ({"kv_lora_rank": 512}, "kv_lora_rank", "not modelled"),
        ({"num_attention_heads": 30}, "head_dim", "not a multiple"),
    ],
)
def test_a_wrong_value_names_the_key(tmp_path: Path, edit: dict[str, Any], field: str, fragment: str) -> None:
    with pytest.raises(InputFileError, match=fragment) as caught:
        read_hf_config(_write(tmp_path, {**LLAMA3_8B, **edit}), "mine")
    assert caught.value.field == field


def test_a_file_that_is_not_a_json_object_is_named(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{\n  "num_hidden_layers": 32,\n  oops\n}')
    with pytest.raises(InputFileError, match=r"broken\.json:3: not JSON"):
        read_hf_config(broken, "x")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(InputFileError, match="not a JSON object"):
        read_hf_config(listed, "x")
