"""JSON codecs derived from type hints (pydantic ``TypeAdapter``).

Every value that crosses a process boundary — workflow payloads and results, activity
arguments and results, signal values, effect payloads — is validated against the function's
type hints and dumped in pydantic's JSON mode, so dates, decimals, enums and models survive a
restart. Never pickle.

Decoding always returns a fresh object: recorded values live in the per-process partition
cache and in documents about to be committed, so a value workflow code may mutate must never
be the stored one (replays would then see a different history).
"""

from __future__ import annotations

import functools
import inspect
import math
import typing
from collections.abc import Callable
from typing import Any

from pydantic import ConfigDict, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from .errors import PayloadValidationError

__all__ = ["ValueCodec", "CallCodec", "codec_for", "fresh"]


def _non_finite(data: Any, depth: int = 0) -> bool:
    """Whether ``data`` holds a float JSON cannot carry (``nan``, ``inf``) in plain containers."""
    if isinstance(data, float):
        return not math.isfinite(data)
    if depth > 100:
        return False
    if isinstance(data, dict):
        return any(_non_finite(v, depth + 1) for v in data.values())
    if isinstance(data, list | tuple | set | frozenset):
        return any(_non_finite(v, depth + 1) for v in data)
    return False


def fresh(data: Any) -> Any:
    """A deep copy of JSON data (dicts and lists are rebuilt; scalars are immutable)."""
    if isinstance(data, dict):
        return {k: fresh(v) for k, v in data.items()}
    if isinstance(data, list):
        return [fresh(v) for v in data]
    return data


class ValueCodec:
    """Encode/decode one value of a declared type (``Any`` when undeclared)."""

    def __init__(self, hint: Any) -> None:
        self.hint = hint
        try:
            # serialize nan/inf as themselves (not null) so that the check in encode() sees them,
            # however deep they sit (dataclasses, nested models under Any, ...)
            self._adapter: TypeAdapter[Any] = TypeAdapter(hint, config=ConfigDict(ser_json_inf_nan="constants"))
        except PydanticUserError:  # a model type carries its own config
            self._adapter = TypeAdapter(hint)

    def encode(self, value: Any, what: str = "value") -> Any:
        """Validate ``value`` against the type and return its JSON form."""
        try:
            valid = self._adapter.validate_python(value)
            data = self._adapter.dump_python(valid, mode="json")
            # JSON has no nan/inf: pydantic writes them as null for untyped values, as a
            # non-standard token for typed floats; either way the value would change, so refuse
            if _non_finite(value) or _non_finite(data):
                raise PayloadValidationError(f"invalid {what}: nan and infinity cannot be stored as JSON")
            return data
        except ValidationError as exc:
            raise PayloadValidationError(f"invalid {what}: {exc}") from exc
        except PydanticSerializationError as exc:
            raise PayloadValidationError(f"{what} is not JSON-serialisable: {exc}") from exc

    def decode(self, data: Any, what: str = "value") -> Any:
        """Rebuild the typed value from its JSON form, as a new object that shares nothing with ``data``."""
        try:
            # pydantic hands containers through unchanged for Any, dict, list, ...: copy first
            return self._adapter.validate_python(fresh(data))
        except ValidationError as exc:
            raise PayloadValidationError(f"stored {what} does not match its type: {exc}") from exc


class CallCodec:
    """Codecs for a function's parameters and return value, from its signature and hints."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.signature = inspect.signature(fn)
        try:
            hints = typing.get_type_hints(fn, include_extras=True)
        except Exception:  # unresolvable forward refs: fall back to Any, never refuse to run
            hints = {}
        self.params = {
            name: ValueCodec(hints.get(name, Any))
            for name, p in self.signature.parameters.items()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        }
        var = {p.kind: name for name, p in self.signature.parameters.items()}
        # a hint on *args / **kwargs types each item / value
        self._var_pos = ValueCodec(hints.get(var.get(inspect.Parameter.VAR_POSITIONAL, ""), Any))
        self._var_kw = ValueCodec(hints.get(var.get(inspect.Parameter.VAR_KEYWORD, ""), Any))
        self.result = ValueCodec(hints.get("return", Any))

    def _codec(self, name: str) -> ValueCodec:
        return self.params.get(name, self._var_kw)

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Bind and validate a call's arguments; return ``{"args": [...], "kwargs": {...}}``.

        Binding follows :meth:`inspect.Signature.bind`, split like ``BoundArguments.args`` /
        ``.kwargs``: positional parameters go to ``args`` up to the first one left to its
        default; every later one that was passed, keyword-only parameters and ``**kwargs``
        go to ``kwargs`` by name. So ``decode_args`` rebinds exactly as the direct call did.
        """
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PayloadValidationError(f"bad arguments for {self.name}: {exc}") from exc
        out_args: list[Any] = []
        out_kwargs: dict[str, Any] = {}
        gap = False  # a positional parameter was left to its default: later ones go by name
        for name, p in self.signature.parameters.items():
            what = f"argument {name!r} of {self.name}"
            if name not in bound.arguments:
                gap = gap or p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                continue
            value = bound.arguments[name]
            if p.kind is p.VAR_POSITIONAL:
                out_args.extend(self._var_pos.encode(v, what) for v in value)
            elif p.kind is p.VAR_KEYWORD:
                out_kwargs.update({k: self._var_kw.encode(v, what) for k, v in value.items()})
            elif p.kind is p.KEYWORD_ONLY or gap:
                out_kwargs[name] = self._codec(name).encode(value, what)
            else:
                out_args.append(self._codec(name).encode(value, what))
        return {"args": out_args, "kwargs": out_kwargs}

    def decode_args(self, data: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Inverse of :meth:`encode_args` (also for payloads stored by earlier versions)."""
        args = list(data.get("args", []))
        kwargs = dict(data.get("kwargs", {}))
        params = self.signature.parameters
        names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        dec_args = tuple(
            (self._codec(names[i]) if i < len(names) else self._var_pos).decode(v, f"argument {i} of {self.name}")
            for i, v in enumerate(args)
        )
        # a keyword named like a positional-only parameter belongs to **kwargs
        dec_kwargs = {
            k: (self._var_kw if k in params and params[k].kind is params[k].POSITIONAL_ONLY else self._codec(k)).decode(
                v, f"argument {k!r} of {self.name}"
            )
            for k, v in kwargs.items()
        }
        return dec_args, dec_kwargs

    def encode_result(self, value: Any) -> Any:
        return self.result.encode(value, f"result of {self.name}")

    def decode_result(self, data: Any) -> Any:
        return self.result.decode(data, f"result of {self.name}")


@functools.cache
def _cached(fn: Callable[..., Any]) -> CallCodec:
    return CallCodec(fn)


def codec_for(fn: Callable[..., Any]) -> CallCodec:
    """The (cached) :class:`CallCodec` of ``fn``."""
    return _cached(fn)
