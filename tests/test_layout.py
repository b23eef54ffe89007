"""The package's shape (docs/architecture.md section 2): no module over 400 lines, and no import cycle between
Tessera's modules. Each has an explicit allow-list of what exists today, which may only shrink."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from pathlib import Path

import grimp

import tessera

PACKAGE = Path(tessera.__file__).parent
MAX_LINES = 400

# Modules over MAX_LINES today, each with its current line count as its ceiling: they may shrink, never grow. They
# are being split; once one is at or under MAX_LINES, test_allow_listed_modules_are_still_over_the_limit fails until
# its entry is removed here, so that the list empties as they shrink.
LONG_MODULES: dict[str, int] = {}

# Import cycles allowed through imports under `if TYPE_CHECKING:` (annotations only): none today. An entry is the
# TYPE_CHECKING import (importer, imported) whose removal breaks its cycle; a new cycle fails, and so does an entry
# that no longer exists.
TYPE_CHECKING_CYCLE_IMPORTS: set[tuple[str, str]] = set()


def _line_counts() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_is_over_the_line_limit() -> None:
    counts = _line_counts()
    over = {
        name: (lines, LONG_MODULES.get(name, MAX_LINES))
        for name, lines in counts.items()
        if lines > LONG_MODULES.get(name, MAX_LINES)
    }
    assert not over, f"modules over their line limit (lines, limit); split them: {over}"


def test_allow_listed_modules_are_still_over_the_limit() -> None:
    counts = _line_counts()
    missing = sorted(set(LONG_MODULES) - set(counts))
    shrunk = {name: counts[name] for name in LONG_MODULES if name in counts and counts[name] <= MAX_LINES}
    assert not missing, f"LONG_MODULES names modules that do not exist; remove them: {missing}"
    assert not shrunk, f"now at most {MAX_LINES} lines; remove them from LONG_MODULES: {shrunk}"


def _cycles(graph: grimp.ImportGraph, removed: AbstractSet[tuple[str, str]] = frozenset()) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), without the ``removed`` imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if (module, imported) in removed:
                continue
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycle_at_run_time() -> None:
    graph = grimp.build_graph("tessera", exclude_type_checking_imports=True, cache_dir=None)
    assert _cycles(graph) == []


def test_no_import_cycle_but_the_allow_listed_type_checking_ones() -> None:
    graph = grimp.build_graph("tessera", cache_dir=None)
    gone = sorted(
        (importer, imported)
        for importer, imported in TYPE_CHECKING_CYCLE_IMPORTS
        if not graph.direct_import_exists(importer=importer, imported=imported)
    )
    assert not gone, f"these imports no longer exist; remove them from TYPE_CHECKING_CYCLE_IMPORTS: {gone}"
    assert _cycles(graph, TYPE_CHECKING_CYCLE_IMPORTS) == [], "a new import cycle (imports under TYPE_CHECKING count)"
    for importer, imported in sorted(TYPE_CHECKING_CYCLE_IMPORTS):
        # Each allow-listed import still closes a cycle (else it is no longer needed here).
        assert graph.find_shortest_chain(importer=imported, imported=importer) is not None, (importer, imported)
