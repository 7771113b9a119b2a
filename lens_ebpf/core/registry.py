"""Parts plug in by name, as node_exporter's collectors do (registerCollector).

A service keeps one Registry naming the packages its parts live in. A part's module
declares it with `@registry.register(name, order=..., settings={...})`: its class, its
start order and its settings models (each one a section of the service's config, e.g.
the agent's `collectors.<key>`). registered() imports every module of those packages
first, so parts are found, not listed: adding one touches its own module and what tests
and documents it, no list elsewhere (the agent's: docs/contributing/feature.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

C = TypeVar("C", bound=type)


@dataclass(frozen=True)
class Registered:
    name: str
    cls: type
    order: int  # start order
    settings: dict[str, type[BaseModel]]


class Registry:
    def __init__(self, packages: tuple[str, ...]) -> None:
        self.packages = packages
        self.parts: dict[str, Registered] = {}
        self._discovered = False

    def register(
        self, name: str, *, order: int, settings: dict[str, type[BaseModel]] | None = None
    ) -> Callable[[C], C]:
        def wrap(cls: C) -> C:
            if name in self.parts and self.parts[name].cls is not cls:
                raise RuntimeError(f"{name} registered twice")
            cls.name = name  # type: ignore[attr-defined]
            self.parts[name] = Registered(name, cls, order, dict(settings or {}))
            return cls

        return wrap

    def registered(self) -> list[Registered]:
        """Every part, in start order, after importing the modules that declare them."""
        if not self._discovered:
            for pkg_name in self.packages:
                pkg = importlib.import_module(pkg_name)
                for mod in pkgutil.walk_packages(pkg.__path__, f"{pkg_name}."):
                    importlib.import_module(mod.name)
            self._discovered = True
        return sorted(self.parts.values(), key=lambda f: (f.order, f.name))

    def settings(self) -> dict[str, type[BaseModel]]:
        """Section key -> its model, in start order."""
        return {k: m for f in self.registered() for k, m in f.settings.items()}

    def __getitem__(self, name: str) -> Any:
        self.registered()
        return self.parts[name]
