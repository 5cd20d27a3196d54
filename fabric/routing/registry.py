"""Routing policies by name: the built-in modes, or a researcher's own class given as
`package.module:ClassName` (e.g. on the command line, `--routing mypkg.policies:MyPolicy`)."""
from __future__ import annotations

import importlib

from fabric.errors import RoutingError
from fabric.routing.modes import BUILTIN
from fabric.routing.policy import RoutingPolicy


def load_policy(spec: str) -> type[RoutingPolicy]:
    """A built-in mode by name (`static`, `ecmp`, `adaptive`) or a class `package.module:ClassName`
    that subclasses RoutingPolicy."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    if ":" not in spec:
        raise RoutingError(f"routing {spec!r} is not a built-in mode ({', '.join(BUILTIN)}) "
                           "nor a class given as package.module:ClassName")
    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise RoutingError(f"routing {spec!r}: cannot import module {module_name!r}: {e}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, RoutingPolicy)):
        raise RoutingError(f"routing {spec!r}: {class_name!r} in {module_name!r} is not a RoutingPolicy subclass")
    return cls
