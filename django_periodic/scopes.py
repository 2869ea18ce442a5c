"""Scope providers: the callables that fan one fire of a schedule out to one run per key.

A provider takes no arguments and returns the scope keys of a fire (tenant ids, account
ids) as a list of strings or ints. It is registered with ``@scopes.provider`` as
``"<module>.<qualname>"``, like a job, and named by ``Schedule.scopes``. Pure: no models are
imported here, so providers can be declared before the apps are ready.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from django_periodic.registry import code_location

# The longest scope key: the length of Run.scope.
KEY_MAX_LENGTH = 200

_F = TypeVar("_F", bound=Callable[[], Any])


class UnknownProvider(LookupError):
    pass


class InvalidScopes(ValueError):
    """A provider returned something other than a list of short strings or ints."""


@dataclass(frozen=True)
class Provider:
    """A registered scope provider."""

    name: str
    func: Callable[[], Any]
    defined_in: str = ""

    @property
    def description(self) -> str:
        """The first line of the function's docstring."""
        return (inspect.getdoc(self.func) or "").partition("\n")[0]


_registry: dict[str, Provider] = {}


@overload
def provider(func: _F, /) -> _F: ...
@overload
def provider(*, name: str | None = None) -> Callable[[_F], _F]: ...
def provider(func: _F | None = None, /, *, name: str | None = None) -> _F | Callable[[_F], _F]:
    """Register a function as a scope provider, by default as ``"<module>.<qualname>"``.

    The function is returned unchanged. Define providers in an installed app's ``jobs.py``
    or ``scopes.py``: both are imported when the apps are ready.
    """

    def register(func: _F) -> _F:
        registered = Provider(
            name=name or f"{func.__module__}.{func.__qualname__}",
            func=func,
            defined_in=code_location(func),
        )
        existing = _registry.get(registered.name)
        if existing and existing.defined_in != registered.defined_in:
            raise ValueError(
                f"Scope provider {registered.name!r} is already registered at "
                f"{existing.defined_in}."
            )
        _registry[registered.name] = registered
        return func

    return register(func) if func is not None else register


def get_provider(name: str) -> Provider:
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "none"
        raise UnknownProvider(
            f"No scope provider named {name!r} is registered (with @scopes.provider). "
            f"Registered: {known}."
        ) from None


def registered_providers() -> dict[str, Provider]:
    """All registered providers by name (a copy)."""
    return dict(_registry)


def scope_keys(name: str) -> list[str]:
    """Call the provider ``name`` and return its keys as strings, in order, without repeats.

    Raises what the provider raises, ``UnknownProvider``, or ``InvalidScopes`` for a value
    that is not a list (or tuple) of non-empty strings of at most ``KEY_MAX_LENGTH``
    characters or ints: a fire is planned for all its keys or not at all.
    """
    returned = get_provider(name).func()
    if not isinstance(returned, list | tuple):
        raise InvalidScopes(
            f"Scope provider {name!r} returned a {type(returned).__name__}, not a list."
        )
    keys = dict.fromkeys(_key(name, value) for value in returned)
    return list(keys)


def _key(name: str, value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise InvalidScopes(
            f"Scope provider {name!r} returned a key of type {type(value).__name__}; "
            "keys are strings or ints."
        )
    if not value or len(value) > KEY_MAX_LENGTH or "\x00" in value:
        raise InvalidScopes(
            f"Scope provider {name!r} returned the key {value[:50]!r}: keys must be 1 to "
            f"{KEY_MAX_LENGTH} characters long, without NUL."
        )
    return value
