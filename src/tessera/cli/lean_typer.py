"""Two of typer's start-up costs that ``tessera`` does not need, deferred until they are needed (docs/cli.md,
"Start-up time"). Nothing changes in what typer prints or does; only when two imports happen.

- **pydantic.** Typer (0.2x) converts each option's value with a pydantic ``TypeAdapter``, built the first time the
  option is processed, also when the option was not given and its value is ``None``, which typer returns as it is
  (``RuntimeParam.coerce``) without the adapter. Every run processes ``--help`` and the completion options unset, so
  every run imported pydantic (about 60 ms of CPU) for nothing. ``defer_adapters`` makes typer build each adapter when
  a value is first converted: ``tessera jobs --queue q`` still builds the one for ``--queue``, with the same checks and
  messages (it is typer's own, built by typer's own ``build_runtime_param``).
- **rich's Markdown and Traceback.** Typer's rich help (``typer.rich_utils``, imported to print a help or an error)
  imports ``rich.markdown`` and ``rich.traceback`` at the top, and with them markdown-it and Pygments (about 45 ms),
  although it uses them only for help written in Markdown (``rich_markup_mode="markdown"``; Tessera's is ``"rich"``)
  and for pretty tracebacks (disabled: ``pretty_exceptions_enable=False``). ``light_rich_help`` lets ``rich_utils``
  import stand-ins for those two classes instead, which import the real class and hand over to it when used, so
  Markdown help or a rich traceback would still print as before.

Both reach into typer's internals (``typer.core.build_runtime_param``, ``typer.rich_utils``), so each checks for what
it patches and does nothing when typer's layout differs: then the commands run as before, only slower, and
tests/cli/test_startup.py fails to say so.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # not at run time: importlib.abc imports importlib.resources, a few ms (the classes below duck-type)
    import importlib.abc
    import importlib.machinery

# The modules typer.rich_utils imports for what Tessera's help does not use, and the class it takes from each.
RICH_STAND_INS = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


def install() -> None:
    """Both, once per process."""
    defer_adapters()
    light_rich_help()


def defer_adapters() -> bool:
    """Make typer build an option's converter (a pydantic ``TypeAdapter``) when a value is first converted, not when
    the option is first processed. False when typer is not laid out as expected (nothing done)."""
    try:
        from typer import _coercion, core
    except ImportError:
        return False
    found = getattr(core, "build_runtime_param", None)
    base = getattr(_coercion, "RuntimeParam", None)
    if found is None or base is None or getattr(found, "deferred", False) or not hasattr(base, "_coerce_value"):
        return False
    if any(  # a converter class with a coerce of its own would be bypassed: leave typer as it is
        isinstance(cls, type) and issubclass(cls, base) and cls is not base and "coerce" in vars(cls)
        for cls in vars(_coercion).values()
    ):
        return False
    build: Callable[[Any], Any] = found

    @dataclass(frozen=True)
    class DeferredRuntimeParam(base):  # type: ignore[misc, valid-type]
        """typer's ``RuntimeParam`` for ``descriptor``, built on the first value to convert (``None`` needs none)."""

        descriptor: Any = None
        built: list[Any] = field(default_factory=list, compare=False, repr=False)

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if not self.built:
                self.built.append(build(self.descriptor))
            return self.built[0]._coerce_value(value, param=param, ctx=ctx)

    def deferred_build(descriptor: Any) -> Any:
        if getattr(descriptor, "file_annotation", None) is not None:  # file options: no pydantic, typer's own class
            return build(descriptor)
        return DeferredRuntimeParam(
            parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, descriptor=descriptor
        )

    deferred_build.deferred = True  # type: ignore[attr-defined]
    setattr(core, "build_runtime_param", deferred_build)  # noqa: B010 (typer.core does not export the name)
    return True


class _Forward(type):
    """The metaclass of a stand-in: calling it or reading an attribute imports the real class and uses it."""

    _module: str
    _name: str

    def real(cls) -> Any:
        return getattr(importlib.import_module(cls._module), cls._name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, attribute: str) -> Any:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        return getattr(cls.real(), attribute)


def _stand_in(module: str, name: str) -> ModuleType:
    stand_in = ModuleType(module, f"Tessera's stand-in while typer.rich_utils loads: {module}.{name} on first use.")
    setattr(stand_in, name, _Forward(name, (), {"_module": module, "_name": name}))
    return stand_in


class _StandInsWhileLoading:
    """``typer.rich_utils``'s own loader, run with the stand-ins in ``sys.modules``; they are taken out once it ran."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        placed = {name: _stand_in(name, cls) for name, cls in RICH_STAND_INS.items() if name not in sys.modules}
        sys.modules.update(placed)
        try:
            self.loader.exec_module(module)
        finally:
            for name, stand_in in placed.items():
                if sys.modules.get(name) is stand_in:
                    del sys.modules[name]

    def __getattr__(self, attribute: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self.loader, attribute)


class _RichUtilsFinder:
    """Finds ``typer.rich_utils`` as the import system would and wraps its loader; then steps aside."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "typer.rich_utils":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once is enough; and the lookup below must not come back here
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = cast("importlib.abc.Loader", _StandInsWhileLoading(spec.loader))
        return spec


def light_rich_help() -> bool:
    """Have ``typer.rich_utils``, when something first imports it, load with the stand-ins (see the module's doc).
    False when it is loaded already or typer has none (nothing done)."""
    if "typer.rich_utils" in sys.modules or importlib.util.find_spec("typer.rich_utils") is None:
        return False
    if not any(isinstance(finder, _RichUtilsFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RichUtilsFinder())
    return True
