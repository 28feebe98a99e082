"""JSON codecs derived from type hints (pydantic ``TypeAdapter``).

Every value that crosses a process boundary — workflow payloads and results, activity
arguments and results, signal values, effect payloads — is validated against the function's
type hints and dumped in pydantic's JSON mode, so dates, decimals, enums and models survive a
restart. Never pickle.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from .errors import PayloadValidationError

__all__ = ["ValueCodec", "CallCodec", "codec_for"]


class ValueCodec:
    """Encode/decode one value of a declared type (``Any`` when undeclared)."""

    def __init__(self, hint: Any) -> None:
        self.hint = hint
        self._adapter: TypeAdapter[Any] = TypeAdapter(hint)

    def encode(self, value: Any, what: str = "value") -> Any:
        """Validate ``value`` against the type and return its JSON form."""
        try:
            valid = self._adapter.validate_python(value)
            return self._adapter.dump_python(valid, mode="json")
        except ValidationError as exc:
            raise PayloadValidationError(f"invalid {what}: {exc}") from exc
        except PydanticSerializationError as exc:
            raise PayloadValidationError(f"{what} is not JSON-serialisable: {exc}") from exc

    def decode(self, data: Any, what: str = "value") -> Any:
        """Rebuild the typed value from its JSON form."""
        try:
            return self._adapter.validate_python(data)
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
        self._var = ValueCodec(Any)
        self.result = ValueCodec(hints.get("return", Any))

    def _codec(self, name: str) -> ValueCodec:
        return self.params.get(name, self._var)

    def encode_args(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Bind and validate a call's arguments; return ``{"args": [...], "kwargs": {...}}``."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise PayloadValidationError(f"bad arguments for {self.name}: {exc}") from exc
        out_args: list[Any] = []
        out_kwargs: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            what = f"argument {name!r} of {self.name}"
            if kind is inspect.Parameter.VAR_POSITIONAL:
                out_args.extend(self._var.encode(v, what) for v in value)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                out_kwargs.update({k: self._var.encode(v, what) for k, v in value.items()})
            elif kind is inspect.Parameter.KEYWORD_ONLY:
                out_kwargs[name] = self._codec(name).encode(value, what)
            elif out_kwargs:  # positional params after a keyword were passed by keyword
                out_kwargs[name] = self._codec(name).encode(value, what)
            else:
                out_args.append(self._codec(name).encode(value, what))
        return {"args": out_args, "kwargs": out_kwargs}

    def decode_args(self, data: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Inverse of :meth:`encode_args`."""
        args = list(data.get("args", []))
        kwargs = dict(data.get("kwargs", {}))
        names = [
            n for n, p in self.signature.parameters.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        dec_args = tuple(
            (self._codec(names[i]) if i < len(names) else self._var).decode(v, f"argument {i} of {self.name}")
            for i, v in enumerate(args)
        )
        dec_kwargs = {k: self._codec(k).decode(v, f"argument {k!r} of {self.name}") for k, v in kwargs.items()}
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
