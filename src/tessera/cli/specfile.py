"""``tessera submit -f spec.yaml``: a YAML mapping with the fields of the API's workload body. The line of each
top-level key is kept so that a field the server rejects is reported as ``spec.yaml:LINE: field: message``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.client.errors import ApiError
from tessera.errors import InputFileError, TesseraError
from tessera.textfiles import read_text_file


@dataclass(frozen=True, slots=True)
class SpecFile:
    path: Path | None
    body: dict[str, Any]
    lines: dict[str, int]  # top-level key -> 1-based line

    def locate(self, error: ApiError) -> TesseraError:
        """``error`` pointed at the file's line when it names a field given in the file."""
        if self.path is None or not error.field:
            return error
        key = error.field.split(".")[0]
        if key not in self.lines:
            return error
        message = error.detail.removeprefix(f"{error.field}: ")
        return InputFileError(str(self.path), self.lines[key], error.field, message)


def load_spec_file(path: Path) -> SpecFile:
    import yaml  # only for submit -f: every other command starts faster without it

    text = read_text_file(path)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        body = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputFileError(str(path), None if mark is None else mark.line + 1, None, problem) from None
    if body is None:
        raise InputFileError(str(path), None, None, "empty spec")
    if not isinstance(body, dict) or not isinstance(node, yaml.MappingNode):
        raise InputFileError(str(path), 1, None, "expected a mapping of workload fields (command, gpus, ...)")
    lines = {str(k.value): k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    if "command" in body and isinstance(body["command"], str):
        raise InputFileError(str(path), lines.get("command"), "command", "give a list: [python, train.py]")
    return SpecFile(path, {str(k): v for k, v in body.items()}, lines)
