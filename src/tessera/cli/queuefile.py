"""``tessera queues apply -f queues.yaml``: queues and quotas in a YAML file, in Kueue's words where Tessera has the
same thing (a Kueue ClusterQueue's ``cohort``, ``queueingStrategy``, flavors with ``nominalQuota``,
``borrowingLimit`` and ``lendingLimit``; ``weight`` is Kueue's ``fairSharing.weight``)::

    queues:
      - name: team-a
        tenant: team-a              # whose tokens may submit to it (default: its name)
        cohort: research            # queues of one cohort lend each other unused quota
        queueingStrategy: BestEffortFIFO   # or StrictFIFO
        weight: 2                   # fair-sharing weight (DRF) within the cohort
        flavors:
          - name: "*"               # a GPU model (A100-80GB) or * for any GPU
            nominalQuota: {gpus: 4, cpu: 32, memory: 128Gi}
            borrowingLimit: {gpus: 2}   # at most this much more, borrowed from the cohort
            lendingLimit: {gpus: 1}     # at most this much of the nominal quota lent to the cohort

Resources: ``gpus`` (or Kueue's ``nvidia.com/gpu``; 0.5 = half a GPU), ``cpu`` (cores, or ``500m``) and ``memory``
(``128Gi``, ``16GiB``; a bare number is MiB). A quota leaves out what it does not limit; no flavors = no limit.

Each queue becomes the body of ``POST /v1/queues`` (``QueueIn``), which creates or replaces it: applying a file
twice changes nothing the second time. Every error names ``FILE:LINE: field: message`` (exit 2), checked for the whole
file before anything is sent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera.errors import InputFileError
from tessera.textfiles import read_text_file

QUEUE_KEYS = {"name", "tenant", "cohort", "queueingStrategy", "weight", "flavors"}
FLAVOR_KEYS = {"name", "nominalQuota", "borrowingLimit", "lendingLimit"}
LIMIT_FIELDS = {"nominalQuota": "nominal", "borrowingLimit": "borrowing_limit", "lendingLimit": "lending_limit"}
RESOURCES = {"gpus": "gpus", "nvidia.com/gpu": "gpus", "cpu": "cpu", "memory": "mem", "mem": "mem"}
Path_ = tuple[str | int, ...]


@dataclass
class QueueDoc:
    """One queue of the file: the API body and where each of its fields was written (API path -> line, name)."""

    body: dict[str, Any]
    line: int
    where: dict[Path_, tuple[int, str]] = field(default_factory=dict)

    def locate(self, path: str, api_field: Path_, message: str) -> InputFileError:
        """``message`` about the API field ``api_field`` as ``FILE:LINE: field-as-written: message``."""
        for end in range(len(api_field), 0, -1):
            found = self.where.get(api_field[:end])
            if found is not None:
                return InputFileError(path, found[0], found[1], message)
        line, label = self.where.get((), (self.line, "queues"))
        return InputFileError(path, line, label, message)


def load_queue_file(path: Path) -> list[QueueDoc]:
    text = read_text_file(path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputFileError(str(path), None if mark is None else mark.line + 1, None, problem) from None
    where = str(path)
    if root is None:
        raise InputFileError(where, None, None, "empty file: expected queues: [...]")
    items = root
    if isinstance(root, yaml.MappingNode):
        pairs = _pairs(where, root, "")
        unknown = [k for k in pairs if k != "queues"]
        if unknown:
            raise InputFileError(where, pairs[unknown[0]][0].start_mark.line + 1, unknown[0], "unknown key (queues)")
        if "queues" not in pairs:
            raise InputFileError(where, _line(root), "queues", "missing: a list of queues")
        items = pairs["queues"][1]
    if not isinstance(items, yaml.SequenceNode):
        raise InputFileError(where, _line(items), "queues", "expected a list of queues")
    docs = [_queue(where, node, f"queues[{i}]") for i, node in enumerate(items.value)]
    seen: dict[str, int] = {}
    for doc in docs:
        name = doc.body["name"]
        if name in seen:
            raise InputFileError(where, doc.line, "name", f"queue {name!r} is declared twice (also line {seen[name]})")
        seen[name] = doc.line
    return docs


def _queue(path: str, node: yaml.Node, label: str) -> QueueDoc:
    if not isinstance(node, yaml.MappingNode):
        raise InputFileError(path, _line(node), label, "expected a mapping (name, tenant, cohort, flavors, ...)")
    pairs = _pairs(path, node, label)
    _refuse_unknown(path, pairs, QUEUE_KEYS, label)
    if "name" not in pairs:
        raise InputFileError(path, _line(node), f"{label}.name", "missing")
    doc = QueueDoc({}, _line(node))
    doc.where[()] = (_line(node), label)
    renames = {"queueingStrategy": "strategy"}
    for key in ("name", "tenant", "cohort", "queueingStrategy", "weight"):
        if key in pairs:
            key_node, value_node = pairs[key]
            api = renames.get(key, key)
            doc.body[api] = _scalar(path, value_node, f"{label}.{key}")
            doc.where[(api,)] = (key_node.start_mark.line + 1, f"{label}.{key}")
    doc.body.setdefault("tenant", doc.body["name"])
    if "flavors" in pairs:
        _flavors(path, pairs["flavors"], f"{label}.flavors", doc)
    return doc


def _flavors(path: str, pair: tuple[yaml.Node, yaml.Node], label: str, doc: QueueDoc) -> None:
    key_node, node = pair
    if not isinstance(node, yaml.SequenceNode):
        raise InputFileError(path, key_node.start_mark.line + 1, label, "expected a list of flavors (name, ...)")
    for i, flavor_node in enumerate(node.value):
        here = f"{label}[{i}]"
        if not isinstance(flavor_node, yaml.MappingNode):
            raise InputFileError(path, _line(flavor_node), here, "expected a mapping (name, nominalQuota, ...)")
        pairs = _pairs(path, flavor_node, here)
        _refuse_unknown(path, pairs, FLAVOR_KEYS, here)
        if "name" not in pairs:
            raise InputFileError(path, _line(flavor_node), f"{here}.name", 'missing: a GPU model or "*"')
        flavor = str(_scalar(path, pairs["name"][1], f"{here}.name"))
        for key, api in LIMIT_FIELDS.items():
            if key not in pairs:
                continue
            limit_key, limit_node = pairs[key]
            doc.where[(api, flavor)] = (limit_key.start_mark.line + 1, f"{here}.{key}")
            limits = doc.body.setdefault(api, {})
            if flavor in limits:
                raise InputFileError(path, _line(flavor_node), f"{here}.name", f"flavor {flavor!r} is given twice")
            limits[flavor] = _quota(path, limit_node, f"{here}.{key}", doc, (api, flavor))


def _quota(path: str, node: yaml.Node, label: str, doc: QueueDoc, api_path: Path_) -> dict[str, Any]:
    if not isinstance(node, yaml.MappingNode):
        raise InputFileError(path, _line(node), label, "expected resources: {gpus: 4, cpu: 32, memory: 128Gi}")
    out: dict[str, Any] = {}
    for name, (key_node, value_node) in _pairs(path, node, label).items():
        if name not in RESOURCES:
            raise InputFileError(
                path, key_node.start_mark.line + 1, f"{label}.{name}", "unknown resource (gpus, cpu, memory)"
            )
        out[RESOURCES[name]] = _scalar(path, value_node, f"{label}.{name}")
        doc.where[(*api_path, RESOURCES[name])] = (key_node.start_mark.line + 1, f"{label}.{name}")
    return out


def _pairs(path: str, node: yaml.MappingNode, label: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key, value in node.value:
        name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
        if name in out:
            where = f"{label}.{name}" if label else name
            raise InputFileError(path, key.start_mark.line + 1, where, "given twice")
        out[name] = (key, value)
    return out


def _refuse_unknown(path: str, pairs: Mapping[str, tuple[yaml.Node, yaml.Node]], known: set[str], label: str) -> None:
    for name, (key, _) in pairs.items():
        if name not in known:
            raise InputFileError(
                path, key.start_mark.line + 1, f"{label}.{name}", f"unknown key ({', '.join(sorted(known))})"
            )


def _scalar(path: str, node: yaml.Node, label: str) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise InputFileError(path, _line(node), label, "expected a single value")
    return yaml.SafeLoader("").construct_object(node, deep=True)


def _line(node: yaml.Node) -> int:
    return int(node.start_mark.line) + 1
