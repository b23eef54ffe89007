"""Model switching on a real engine, on the CPU: ONE ``transformers serve`` process (``TransformersServeEngine`` on
demand) serves two tiny random-initialised Llamas made at test time (``tessera.serving.tiny_model``, in the engines'
virtualenv). A request to A loads it (cold), then B loads on demand beside it (cold), then A again is served from
memory (hot); after ``--model-timeout`` idle seconds both are unloaded and the next request to A is a cold load
again. Each phase's time to first token is measured through the official ``openai`` client and printed.

The engines live in their own virtualenv (``bash scripts/engines.sh``, ``make test-engines``); without it this test
skips and says so. Marker ``engines``: ``make test`` runs it apart, one engine at a time.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import openai
import pytest

from tessera.serving.engines.process import LocalProcess, free_port
from tessera.serving.engines.transformers_serve import TransformersServeEngine

ROOT = Path(__file__).resolve().parents[2]
ENGINE_VENV = Path(os.environ.get("TESSERA_ENGINE_VENV", ROOT / ".venv-vllm"))
ENGINE_PYTHON = ENGINE_VENV / "bin" / "python"
SMOLLM2 = ROOT / ".tessera" / "models" / "SmolLM2-135M-Instruct"
IDLE_S = 4  # transformers serve's --model-timeout
START_S = 300.0

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.engines,
    pytest.mark.skipif(
        not ENGINE_PYTHON.exists(), reason=f"no engine virtualenv at {ENGINE_VENV}: run `bash scripts/engines.sh`"
    ),
]


def tiny_models(folder: Path, n: int) -> list[Path]:
    """``n`` tiny random models, made now in the engines' virtualenv (this checkout's ``tessera`` on its path)."""
    outs = [folder / f"tiny-{i}" for i in range(n)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(ENGINE_PYTHON), "-m", "tessera.serving.tiny_model", "--out", *map(str, outs)],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert [Path(line) for line in done.stdout.split()] == [p.resolve() for p in outs]
    return outs


async def first_token_s(ai: openai.AsyncOpenAI, model: str) -> float:
    """One streamed chat completion: seconds until its first generated token (content or the end of generation)."""
    start = time.monotonic()
    stream = await ai.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=4, stream=True
    )
    first: float | None = None
    async for chunk in stream:
        if first is None and chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason):
            first = time.monotonic() - start
    assert first is not None, f"no token from {model}"
    return first


def loads(log: Path, name: str) -> int:
    """How many times the engine has loaded ``name`` (``transformers serve`` logs each load at warning level)."""
    return log.read_text(errors="replace").count(f"Loading {name}@main\n")


def test_one_transformers_serve_switches_two_models_hot_and_cold(tmp_path: Path) -> None:
    a, b = tiny_models(tmp_path, 2)
    others = {"tiny-b": str(b)}
    if (SMOLLM2 / ".tessera-converted").exists():  # a real 135M model beside them, when scripts/engines.sh made it
        others["smollm2"] = str(SMOLLM2)
    log = tmp_path / "transformers-serve.log"
    engine = TransformersServeEngine(
        "tiny-a",
        free_port(),
        weights=str(a),
        others=others,
        model_timeout_s=IDLE_S,
        python=str(ENGINE_PYTHON),
        env={"CUDA_VISIBLE_DEVICES": "", "TMPDIR": str(tmp_path)},
        runner=LocalProcess(str(log)),
    )
    times: dict[str, float] = {}

    async def phase(label: str, model: str, cold: bool) -> None:
        before = loads(log, model)
        times[label] = await first_token_s(ai, model)
        assert loads(log, model) == before + (1 if cold else 0), (
            f"{label}: {model} loaded {'once' if cold else 'again'}?"
        )

    async def run() -> None:
        started = time.monotonic()
        await engine.start(START_S)
        print(f"\ntransformers serve (on demand, --model-timeout {IDLE_S}), models {sorted(engine.models)}: "
              f"healthy after {time.monotonic() - started:.1f} s")  # fmt: skip
        try:
            await phase("A cold (first load)", "tiny-a", cold=True)
            await phase("B cold (A loaded)", "tiny-b", cold=True)
            await phase("A hot", "tiny-a", cold=False)
            await phase("B hot", "tiny-b", cold=False)
            if "smollm2" in others:
                await phase("SmolLM2 cold (A, B loaded)", "smollm2", cold=True)
                await phase("SmolLM2 hot", "smollm2", cold=False)
                await phase("A hot after SmolLM2", "tiny-a", cold=False)
            await asyncio.sleep(IDLE_S + 2)  # every model idle past the timeout: unloaded
            await phase("A cold after idle unload", "tiny-a", cold=True)
            await phase("B cold after idle unload", "tiny-b", cold=True)
            if "smollm2" in others:
                await phase("SmolLM2 cold after idle unload", "smollm2", cold=True)
            await engine.sleep()  # POST /reset: everything unloaded, the process kept
            await phase("A cold after /reset", "tiny-a", cold=True)
        finally:
            await ai.close()
            await engine.stop()

    ai = openai.AsyncOpenAI(base_url=f"{engine.base_url}/v1", api_key="none", max_retries=0, timeout=START_S)
    asyncio.run(run())
    print("first-token latency per phase: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in times.items()))
