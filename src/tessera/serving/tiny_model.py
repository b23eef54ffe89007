"""``python -m tessera.serving.tiny_model --out DIR [DIR ...] [--seed N]``: tiny causal LMs with random weights.

For the multi-model and switching tests of the real engines, where what matters is loading, unloading and serving,
not the answers: a Llama of 2 layers, hidden size 64, with a byte-level tokenizer of its own (256 byte tokens plus
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, and a ChatML chat template), about 90,000 parameters, saved
with ``save_pretrained`` as a plain model folder (``config.json``, ``model.safetensors``, the tokenizer). No hub
download and no other model is needed. Several folders are made in one run (the imports take most of its time),
the first with seed N, the next with N + 1, and so on: different models. They answer gibberish.

Runs in the engines' virtualenv (``scripts/engines.sh``), which has ``torch`` and ``transformers``; nothing here is
imported by the control plane. Prints each folder's absolute path.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LAYERS, HIDDEN, HEADS, KV_HEADS, INTERMEDIATE, CONTEXT = 2, 64, 4, 2, 128, 1024


def make(out: Path, seed: int = 0) -> Path:
    """Write a tiny random-initialised model folder at ``out`` (replacing what is there) and return its path."""
    # Imported by name: they exist only in the engines' virtualenv, not where the control plane is type-checked.
    torch: Any = importlib.import_module("torch")
    tokenizers: Any = importlib.import_module("tokenizers")
    transformers: Any = importlib.import_module("transformers")

    alphabet = sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: i for i, char in enumerate(alphabet)}
    for special in SPECIALS:
        vocab[special] = len(vocab)
    backend: Any = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIALS))
    tokenizer: Any = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=SPECIALS[0], bos_token=SPECIALS[1], eos_token=SPECIALS[2]
    )
    tokenizer.chat_template = CHAT_TEMPLATE

    torch.manual_seed(seed)
    config: Any = transformers.LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        pad_token_id=vocab[SPECIALS[0]],
        bos_token_id=vocab[SPECIALS[1]],
        eos_token_id=vocab[SPECIALS[2]],
        tie_word_embeddings=True,
    )
    model: Any = transformers.LlamaForCausalLM(config)
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.serving.tiny_model", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, nargs="+", required=True, help="the model folders to write")
    parser.add_argument("--seed", type=int, default=0, help="the first folder's seed (default 0)")
    ns = parser.parse_args(argv)
    for i, out in enumerate(ns.out):
        print(make(out, ns.seed + i))
    return 0


if __name__ == "__main__":
    sys.exit(main())
