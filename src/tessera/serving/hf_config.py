"""A model given by its architecture: a Hugging Face ``config.json`` turned into the twin's ``ModelSpec``.

Who calls it: ``model_book`` (``tessera simulate serving --model-config NAME=PATH``, ``bench/serving_fidelity.py``).

Keys read (the first of each one's spellings that the file has; ``text_config`` is read instead of the top level
when the top level has no layer count, as multimodal configs nest their language model):

- layers: ``num_hidden_layers``, ``n_layer``, ``num_layers``, ``n_layers``; required;
- hidden size: ``hidden_size``, ``n_embd``, ``d_model``; required;
- attention heads: ``num_attention_heads``, ``n_head``, ``num_heads``, ``n_heads``; required;
- KV heads: ``num_key_value_heads``, ``num_kv_heads``, ``n_head_kv``, ``multi_query_group_num`` (``multi_query:
  true`` is one); absent: as many as the attention heads (no grouped-query attention);
- head size: ``head_dim``, ``kv_channels``; absent: hidden size / heads (an error unless whole);
- vocabulary: ``vocab_size``, ``padded_vocab_size``, ``n_vocab``; required;
- dtype: ``torch_dtype``, ``dtype``; required;
- MLP width: ``intermediate_size``, ``n_inner``, ``ffn_dim``, ``ffn_hidden_size``; absent: 4 x hidden for the
  classic architectures of ``FOUR_X_MLP`` (bloom, gpt2, falcon, gptj), else required;
- tied embeddings: ``tie_word_embeddings``; absent: tied for the model types of ``TIED_BY_DEFAULT``, else untied;
- experts: ``num_local_experts``, ``num_experts``, ``n_routed_experts``, with ``num_experts_per_tok`` (then
  required) and ``moe_intermediate_size`` (absent: the MLP width); absent: a dense model.

Parameters: the embeddings (vocabulary x hidden, twice when untied), and per layer the attention projections (Q and
O: hidden x heads x head size each; K and V: hidden x KV heads x head size each) and the MLP: three hidden x width
matrices (gated: SwiGLU, GeGLU) unless ``model_type`` is one of ``UNGATED_MLP`` (two). A mixture of experts holds
every expert's MLP (weights) and runs ``num_experts_per_tok`` of them per token (FLOPs); a shared expert
(``shared_expert_intermediate_size``) is one more MLP of that width. Norms and biases are left out (under 0.1%).
Weights and the KV cache are at the dtype's bytes; KV bytes per token = 2 x layers x KV heads x head size x bytes.
Tensor parallelism: ``models.default_tensor_parallel``.

Refused, naming the key: quantized weights (``quantization_config``) and multi-head latent attention
(``kv_lora_rank``), which the twin does not model; a value that is not a positive whole number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tessera.core.errors import InputFileError
from tessera.serving.models import ModelSpec, default_tensor_parallel
from tessera.textfiles import read_text_file

LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN = ("hidden_size", "n_embd", "d_model")
HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
HEAD_DIM = ("head_dim", "kv_channels")
VOCAB = ("vocab_size", "padded_vocab_size", "n_vocab")
DTYPE = ("torch_dtype", "dtype")
MLP_WIDTH = ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size")
EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
# Architectures whose MLP is two matrices (up, down) rather than a gated three; the first four default to 4 x hidden.
FOUR_X_MLP = frozenset({"bloom", "gpt2", "falcon", "gptj"})
UNGATED_MLP = FOUR_X_MLP | frozenset({"gpt_neox", "opt", "gpt_bigcode", "mpt", "phi", "starcoder2", "codegen"})
TIED_BY_DEFAULT = frozenset({"bloom", "gpt2", "falcon", "opt", "gpt_bigcode", "mpt", "gemma", "gemma2", "gemma3_text"})


def read_hf_config(path: str | Path, name: str) -> ModelSpec:
    """The ``ModelSpec`` named ``name`` of the architecture in the ``config.json`` at ``path``; raises
    ``InputFileError(path, None, key, ...)`` naming the key that is missing or wrong."""
    source = Path(path)
    try:
        data = json.loads(read_text_file(source))
    except json.JSONDecodeError as err:
        raise InputFileError(str(source), err.lineno, None, f"not JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise InputFileError(str(source), None, None, "not a JSON object (a config.json is one)")
    return spec_from_hf_config(data, name, str(source))


def spec_from_hf_config(config: Mapping[str, Any], name: str, where: str = "config.json") -> ModelSpec:
    """``read_hf_config`` on an already parsed ``config`` (``where`` names it in errors)."""
    keys = _Keys(_text_config(config), where)
    for refused, why in (("quantization_config", "quantized weights"), ("kv_lora_rank", "latent attention (MLA)")):
        if refused in keys.config:
            raise InputFileError(where, None, refused, f"{why} are not modelled by the twin")
    model_type = str(keys.config.get("model_type", "")).lower()
    layers, hidden, heads = keys.count(LAYERS), keys.count(HIDDEN), keys.count(HEADS)
    kv_heads = 1 if keys.config.get("multi_query") is True else keys.count(KV_HEADS, default=heads)
    head_dim = keys.count(HEAD_DIM, default=0) or _split(hidden, heads, where)
    vocab = keys.count(VOCAB)
    dtype_bytes = keys.dtype_bytes()
    width = keys.count(MLP_WIDTH, default=4 * hidden if model_type in FOUR_X_MLP else None)
    tied = keys.config.get("tie_word_embeddings", model_type in TIED_BY_DEFAULT) is True
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = (2 if model_type in UNGATED_MLP else 3) * hidden
    experts = keys.count(EXPERTS, default=0)
    expert_width = keys.count(("moe_intermediate_size",), default=width) if experts else width
    shared = keys.count(("shared_expert_intermediate_size",), default=0) * mlp
    embeddings = vocab * hidden * (1 if tied else 2)
    if experts:
        active = keys.count(("num_experts_per_tok",))
        per_layer_all = attention + experts * expert_width * mlp + shared + hidden * experts
        per_layer_active = attention + min(active, experts) * expert_width * mlp + shared + hidden * experts
    else:
        per_layer_all = per_layer_active = attention + width * mlp
    params_b = (embeddings + layers * per_layer_all) / 1e9
    active_b = (embeddings + layers * per_layer_active) / 1e9
    return ModelSpec(
        name,
        params_b,
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=dtype_bytes,
        tensor_parallel=default_tensor_parallel(params_b * 1e9 * dtype_bytes),
        active_params_b=active_b if experts else None,
    )


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part: ``text_config`` when the top level has no layer count (its dtype may stay at
    the top level)."""
    nested = config.get("text_config")
    if any(k in config for k in LAYERS) or not isinstance(nested, dict):
        return config
    inherited = {k: config[k] for k in DTYPE if k in config}
    return {**inherited, **nested}


def _split(hidden: int, heads: int, where: str) -> int:
    if hidden % heads:
        raise InputFileError(where, None, "head_dim", f"missing, and hidden size {hidden} is not a multiple of {heads}")
    return hidden // heads


class _Keys:
    """Reads the first present spelling of a key, with errors naming the file and the (first) key."""

    def __init__(self, config: Mapping[str, Any], where: str) -> None:
        self.config = config
        self.where = where

    def count(self, spellings: tuple[str, ...], default: int | None = None) -> int:
        for key in spellings:
            value = self.config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputFileError(self.where, None, key, f"must be a whole number >= 1, got {value!r}")
            return value
        if default is None:
            also = f" (or {', '.join(spellings[1:])})" if len(spellings) > 1 else ""
            raise InputFileError(self.where, None, spellings[0], f"missing{also}: the twin needs it to size the model")
        return default

    def dtype_bytes(self) -> int:
        for key in DTYPE:
            value = self.config.get(key)
            if value is None:
                continue
            text = str(value).lower().removeprefix("torch.")
            if text not in DTYPE_BYTES:
                known = ", ".join(DTYPE_BYTES)
                raise InputFileError(self.where, None, key, f"unknown dtype {value!r} (known: {known})")
            return DTYPE_BYTES[text]
        raise InputFileError(self.where, None, DTYPE[0], "missing (or dtype): the twin needs the weights' dtype")
