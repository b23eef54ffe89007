"""Subcommands imported when they are named: ``tessera jobs --help`` imports and builds ``jobs`` alone, not the
other fourteen commands and their modules.

Typer turns every registered command into a click command on each run, reading each function's signature: with
Tessera's fifteen commands and groups that cost about 25 ms of CPU, and importing their modules more. ``LazyGroup``
is the root group's class (``typer.Typer(cls=...)``): it knows each subcommand as ``"module:attribute"`` (a command
function or a ``typer.Typer`` group) in the order they are listed, and builds one the first time click asks for it
by name. Listing the names (a typo's suggestion, completion of the command's name) loads nothing; ``tessera --help``
and completion of a subcommand's options load what they show. Each subcommand is built by typer itself, through a
``typer.Typer`` holding it alone with the root's settings, so its options, help and behaviour are what
``app.command(name)(function)`` or ``app.add_typer(group, name=name)`` would give.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar

import typer
from typer.core import TyperGroup

if TYPE_CHECKING:
    from typer._click import Command, Context  # typer's own click (typer >= 0.20 carries it inside)


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name, in order: the built ones, and the ones still named ``"module:attribute"``, built
    by ``build`` on first access. Iterating (names, ``len``, ``in``) builds nothing."""

    def __init__(
        self, built: Mapping[str, Command], lazy: Mapping[str, str], build: Callable[[str, object], Command]
    ) -> None:
        self._order = list(lazy) + [name for name in built if name not in lazy]
        self._built = dict(built)
        self._lazy = dict(lazy)
        self._build = build

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in self._lazy:
                raise KeyError(name)
            module, _, attribute = self._lazy[name].partition(":")
            self._built[name] = self._build(name, getattr(importlib.import_module(module), attribute))
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        if name not in self._built and name not in self._lazy:
            self._order.append(name)
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self._built and name not in self._lazy:
            raise KeyError(name)
        self._built.pop(name, None)
        self._lazy.pop(name, None)
        self._order.remove(name)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._order))

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._built or name in self._lazy


class LazyGroup(TyperGroup):
    """A typer group whose subcommands are ``"module:attribute"`` strings, imported and built when named. Subclass
    it with ``subcommands`` (name to target, in the order of ``--help``) and pass the subclass as ``typer.Typer(cls=)``;
    ``pretty_exceptions_short`` is the root app's setting, which typer passes down to each command."""

    subcommands: ClassVar[Mapping[str, str]] = {}
    pretty_exceptions_short: ClassVar[bool] = True

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(self.commands, self.subcommands, self._build)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # the names only: typer's own list_commands would build every one

    def _build(self, name: str, target: object) -> Command:
        holder = typer.Typer(
            rich_markup_mode=self.rich_markup_mode,
            pretty_exceptions_short=self.pretty_exceptions_short,
            suggest_commands=self.suggest_commands,
            add_completion=False,
        )
        if isinstance(target, typer.Typer):
            holder.add_typer(target, name=name)
        elif callable(target):
            holder.command(name)(target)
        else:
            raise TypeError(f"tessera {name}: {target!r} is neither a command function nor a typer.Typer")
        return typer.main.get_group(holder).commands[name]
