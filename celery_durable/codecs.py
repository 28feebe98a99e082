"""JSON codecs derived from type hints (pydantic ``TypeAdapter``).

Every value that crosses a process boundary — workflow payloads and results, activity
arguments and results, signal values, effect payloads — is validated against the function's
type hints and dumped in pydantic's JSON mode, so dates, decimals, enums and models survive a
restart. Never pickle.

Fidelity: what the other side decodes equals what the caller passed, under the declared type,
or the caller gets a :class:`PayloadValidationError` naming the path to the value (never a
silently changed value). A hint carries what it names (``set[int]``, ``bytes`` as base64,
``dict[int, str]``, ``datetime``, models); an untyped (``Any``) position carries JSON's own
values only (``dict`` with ``str`` keys, ``list``, ``str``, ``int``, ``float``, ``bool``,
``None``), except that a ``tuple`` arrives as a ``list``, as with Celery's JSON serializer.
Refused everywhere: ``nan``/``inf`` (JSON has none), integers beyond ±(2^53−1) (Cosmos keeps
numbers as doubles: a value a store cannot hold exactly is refused on every store, so a payload
valid on SQLite never breaks on Cosmos) and strings with lone surrogates (not UTF-8).

Decoding always returns a fresh object: recorded values live in the per-process partition
cache and in documents about to be committed, so a value workflow code may mutate must never
be the stored one (replays would then see a different history).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
import typing
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, PydanticUserError, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from celery_durable.errors import NonRetryableError, PayloadValidationError

__all__ = ["ValueCodec", "CallCodec", "codec_for", "fresh", "MAX_JSON_INT", "ResultPayloadValidationError"]

#: the largest integer every store keeps exactly (a double's 53-bit mantissa: Cosmos, JavaScript)
MAX_JSON_INT = 2**53 - 1

#: serialize nan/inf as themselves (not null) so the fidelity check sees them, however deep they
#: sit; bytes as base64 so any bytes round-trip (UTF-8 text would fail on binary data)
_ENCODE = ConfigDict(ser_json_inf_nan="constants", ser_json_bytes="base64")
#: decoding reads bytes back from base64; kept apart from encoding so that a caller's ``str``
#: passed for ``bytes`` is its UTF-8 (pydantic's coercion), not base64-decoded
_DECODE = ConfigDict(ser_json_inf_nan="constants", ser_json_bytes="base64", val_json_bytes="base64")


class ResultPayloadValidationError(PayloadValidationError, NonRetryableError):
    """A result JSON cannot carry faithfully: fails the activity at once (a retry computes it again)."""


def fresh(data: Any) -> Any:
    """A deep copy of JSON data (dicts and lists are rebuilt; scalars are immutable)."""
    if isinstance(data, dict):
        return {k: fresh(v) for k, v in data.items()}
    if isinstance(data, list):
        return [fresh(v) for v in data]
    return data


# --- fidelity checks (pure functions of values; iterative, so deep nesting cannot overflow) -------


def _scalar_problem(x: Any) -> str | None:
    """Why a JSON scalar cannot be stored exactly on every store, or None."""
    if isinstance(x, float) and not math.isfinite(x):
        return f"{x!r}: nan and infinity have no JSON form"
    if isinstance(x, int) and not isinstance(x, bool) and not -MAX_JSON_INT <= x <= MAX_JSON_INT:
        return (
            f"the integer {x} is beyond ±(2^53−1), the range every store keeps exactly (Cosmos keeps "
            "numbers as doubles): pass it as a str or Decimal"
        )
    if isinstance(x, float) and x.is_integer() and abs(x) > MAX_JSON_INT:
        # JSON has one number type: Cosmos (JavaScript) writes 2.0**60 as 1152921504606847000,
        # which comes back as a different int, and 1e16 as an int a codec then refuses
        return (
            f"the float {x!r} is a whole number beyond ±(2^53−1): a store may give it back as an "
            "integer of another value; pass it as a str or Decimal"
        )
    if isinstance(x, str) and not x.isascii():
        try:
            x.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = x[exc.start]
            return f"the string holds a lone surrogate ({bad!r}), which UTF-8 (every store's encoding) cannot carry"
    return None


#: 16+ digits in a row (maybe an integer beyond 2^53, or just a long fraction: checked exactly
#: then), or an exponent (a float such as 1e16 may be a whole number beyond 2^53)
_LONG_DIGITS = re.compile(rb"\d{16}|\d[eE]")


def _suspicious(data: Any) -> bool:
    """Whether JSON data may hold nan/inf, a lone surrogate or a big integer (a Rust-speed screen)."""
    try:
        text = to_json(data, inf_nan_mode="constants")
    except PydanticSerializationError:  # a lone surrogate, or not JSON at all
        return True
    return b"NaN" in text or b"Infinity" in text or _LONG_DIGITS.search(text) is not None


def json_problem(data: Any, root: str) -> str | None:
    """``path: reason`` for the first scalar of JSON data no store keeps exactly, or None."""
    stack: list[tuple[str, Any]] = [(root, data)]
    while stack:
        path, x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                problem = _scalar_problem(k)
                if problem:
                    return f"{path}: key {k!r}: {problem}"
                stack.append((f"{path}[{k!r}]", v))
        elif isinstance(x, list | tuple):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(x))))
        else:
            problem = _scalar_problem(x)
            if problem:
                return f"{path}: {problem}"
    return None


def _advice(x: Any) -> str:
    """What JSON would make of a value that is not one of its own, and how to carry it."""
    kind = type(x).__name__
    if isinstance(x, set | frozenset):
        return f"a {kind} would arrive as a list: declare its type (e.g. {kind}[int]) to carry it"
    if isinstance(x, bytes | bytearray | memoryview):
        return f"{kind} would arrive as a str: declare the type bytes to carry them (as base64)"
    if isinstance(x, BaseModel) or (dataclasses.is_dataclass(x) and not isinstance(x, type)):
        return f"a {kind} would arrive as a dict: declare its type ({kind}) to carry it"
    return f"a {kind} is not a JSON value (it would arrive changed): declare its type to carry it"


def _fields(x: Any) -> list[tuple[str, Any]] | None:
    """``(name, value)`` of a model's or dataclass's fields; None for other values."""
    if isinstance(x, BaseModel):
        return list(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [(f.name, getattr(x, f.name)) for f in dataclasses.fields(x)]
    return None


def _equal(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # an __eq__ that cannot answer (arrays): look closer
        return False


def difference(sent: Any, back: Any, root: str) -> str | None:
    """``path: reason`` for the first place where ``back`` (decoded) is not ``==`` to ``sent``, or None.

    An exact ``tuple`` arriving as a ``list`` is not a difference (JSON's one sequence). Equal
    subtrees are skipped at C speed, so only the parts that changed are walked.
    """
    stack: list[tuple[str, Any, Any]] = [(root, sent, back)]
    while stack:
        path, a, b = stack.pop()
        if type(a) is tuple and type(b) is list:  # an untyped tuple arrives as a list (documented)
            b = tuple(b)
        if _equal(a, b):
            continue
        problem = _scalar_problem(a) if isinstance(a, str | int | float) else None
        if problem:
            return f"{path}: {problem}"
        if isinstance(a, dict) and isinstance(b, dict):
            if len(a) != len(b):
                return f"{path}: keys would collide once written as JSON strings"
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True):
                problem = _scalar_problem(ka)
                if problem:
                    return f"{path}: key {ka!r}: {problem}"
                if not _equal(ka, kb):
                    return (
                        f"{path}: key {ka!r} ({type(ka).__name__}) would arrive as {kb!r}: JSON keys are "
                        "strings; declare the type (e.g. dict[int, str]) to carry it"
                    )
                stack.append((f"{path}[{ka!r}]", va, vb))
        elif isinstance(a, list | tuple) and type(a) is type(b):
            if len(a) != len(b):
                return f"{path}: {len(a)} items would arrive as {len(b)}"
            stack.extend((f"{path}[{i}]", va, vb) for i, (va, vb) in reversed(list(enumerate(zip(a, b, strict=True)))))
        elif type(a) is not type(b):
            return (
                f"{path}: {_advice(a)}"
                if not isinstance(a, str | int | float)
                else f"{path}: {a!r} would arrive as {b!r}"
            )
        elif (fa := _fields(a)) is not None:
            fb = dict(_fields(b) or [])
            for name, va in fa:
                if name not in fb:
                    return f"{path}.{name}: the field would be lost"
                stack.append((f"{path}.{name}", va, fb[name]))
            if not stack:  # equal fields, yet unequal: private attributes or extras
                return f"{path}: {a!r} would arrive as {b!r}"
        else:
            return f"{path}: {a!r} would arrive as {b!r}"
    return None


def _children(x: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(x, dict):
        yield from ((f"[{k!r}]", v) for k, v in x.items())
    elif isinstance(x, list | tuple):
        yield from ((f"[{i}]", v) for i, v in enumerate(x))
    elif isinstance(x, set | frozenset):
        yield from (("{…}", v) for v in x)
    else:
        yield from ((f".{name}", v) for name, v in _fields(x) or [])


def _non_utf8_bytes(value: Any, root: str) -> str | None:
    """Path to the first ``bytes`` that is not UTF-8 (what a model's default bytes mode cannot dump)."""
    stack: list[tuple[str, Any]] = [(root, value)]
    seen: set[int] = set()  # a value may contain itself
    while stack:
        path, x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, bytes | bytearray):
            try:
                bytes(x).decode("utf-8")
            except UnicodeDecodeError:
                return path
            continue
        stack.extend((path + suffix, v) for suffix, v in reversed(list(_children(x))))
    return None


def _untyped(hint: Any) -> bool:
    return hint is Any or hint is object


class ValueCodec:
    """Encode/decode one value of a declared type (``Any`` when undeclared)."""

    def __init__(self, hint: Any) -> None:
        self.hint = hint
        self._untyped = _untyped(hint)
        # ``-> NoReturn`` / ``-> Never`` (as Temporal's samples annotate): no value is valid
        self._no_value = hint is typing.NoReturn or hint is getattr(typing, "Never", typing.NoReturn)

    @functools.cached_property
    def _adapter(self) -> TypeAdapter[Any]:
        return self._build(_ENCODE)

    @functools.cached_property
    def _decoder(self) -> TypeAdapter[Any]:
        return self._adapter if self._untyped else self._build(_DECODE)

    def _build(self, config: ConfigDict) -> TypeAdapter[Any]:
        try:
            return TypeAdapter(self.hint, config=config)
        except PydanticUserError:  # a model or dataclass type carries its own config
            return TypeAdapter(self.hint)

    def encode(self, value: Any, what: str = "value", root: str = "value") -> Any:
        """Validate ``value`` against the type and return its JSON form.

        Refused (:class:`PayloadValidationError`, naming the path from ``root``) unless decoding
        that JSON gives back ``value`` as validated: see the module docstring.
        """
        if self._no_value:
            raise PayloadValidationError(f"invalid {what}: annotated NoReturn, yet a value came back: {value!r:.200}")
        try:
            valid = self._adapter.validate_python(value)
            data = self._adapter.dump_python(valid, mode="json")
        except ValidationError as exc:
            raise PayloadValidationError(f"invalid {what}: {exc}") from exc
        except PydanticSerializationError as exc:
            raise PayloadValidationError(f"{what} is not JSON-serialisable: {exc}") from exc
        except UnicodeDecodeError as exc:  # bytes dumped as UTF-8 text (a model's own config)
            where = _non_utf8_bytes(value, root) or root
            raise PayloadValidationError(
                f"{what} cannot be stored faithfully as JSON: {where}: bytes that are not UTF-8 cannot be "
                "written as text; set ser_json_bytes='base64' and val_json_bytes='base64' in the model's config"
            ) from exc
        except ValueError as exc:  # pydantic's "Circular reference detected"
            raise PayloadValidationError(f"{what} is not JSON-serialisable: {exc}") from exc
        # what the other side decodes: the JSON itself where untyped, else the hint's reading of it
        problem = None
        back = data
        if not self._untyped:
            try:
                back = self._decoder.validate_python(data)
            except ValidationError as exc:
                err = exc.errors()[0]
                at = "".join(f"[{part!r}]" for part in err.get("loc", ()))
                problem = f"{root}{at}: its JSON form does not decode back to it ({err.get('msg')})"
        problem = problem or difference(valid, back, root)
        if problem is None and _suspicious(data):  # nan, a surrogate, a big int, however it got there
            problem = json_problem(data, root)
        if problem:
            raise PayloadValidationError(f"{what} cannot be stored faithfully as JSON: {problem}")
        return data

    def decode(self, data: Any, what: str = "value") -> Any:
        """Rebuild the typed value from its JSON form, as a new object that shares nothing with ``data``."""
        try:
            # pydantic hands containers through unchanged for Any, dict, list, ...: copy first
            return self._decoder.validate_python(fresh(data))
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
                out_args.extend(self._var_pos.encode(v, what, f"{name}[{i}]") for i, v in enumerate(value))
            elif p.kind is p.VAR_KEYWORD:
                out_kwargs.update(
                    {k: self._var_kw.encode(v, f"argument {k!r} of {self.name}", k) for k, v in value.items()}
                )
            elif p.kind is p.KEYWORD_ONLY or gap:
                out_kwargs[name] = self._codec(name).encode(value, what, name)
            else:
                out_args.append(self._codec(name).encode(value, what, name))
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
        """The result's JSON form; a result JSON cannot carry raises :class:`ResultPayloadValidationError`."""
        try:
            return self.result.encode(value, f"result of {self.name}", "result")
        except PayloadValidationError as exc:
            # the body would compute the same value again: no runner may retry it
            raise ResultPayloadValidationError(str(exc)) from exc

    def decode_result(self, data: Any) -> Any:
        return self.result.decode(data, f"result of {self.name}")


@functools.cache
def _cached(fn: Callable[..., Any]) -> CallCodec:
    return CallCodec(fn)


def codec_for(fn: Callable[..., Any]) -> CallCodec:
    """The (cached) :class:`CallCodec` of ``fn``."""
    return _cached(fn)


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same value as JSON means it: ``True`` is not ``1`` (Python's
    ``==`` says it is), while ``1`` and ``1.0`` are one number (JSON has one number type, and a
    store such as Cosmos gives an integral float back as an int)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
