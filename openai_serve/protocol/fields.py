"""Typed, named reads from a JSON request body: every wrong type or value is a 400 naming the field.

`null` means "the default" for every optional field, as in the OpenAI API. A `Fields` remembers
which keys were read, so that `check_unknown()` can report a key nobody reads to the request's
`UnknownFields`: ignored, logged and named in a response header (vLLM's way: clients and chat UIs
send fields of other servers), or a 400 with `--strict-request-fields` (OpenAI's way). A known field
with a wrong type or value is always a 400 that names it. JSON booleans are not numbers here,
although Python's `bool` is an `int`.
"""

from collections.abc import Callable
from typing import TypeVar

from core.sampling_params import Bounds
from openai_serve.errors import bad_request, unsupported

T = TypeVar("T")


def _type_name(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def are_ints(values: list[object]) -> bool:
    """`all(is_int(v) for v in values)` at C speed: prompts of token ids are checked on the event
    loop, a thousand ids per request. JSON gives exact ints (and bools, whose type is not int)."""
    return set(map(type, values)) <= {int}


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class UnknownFields:
    """The fields of one request that nobody reads (`messages[0].mood` names a nested one)."""

    def __init__(self, is_strict: bool = False) -> None:
        self.is_strict = is_strict
        self.names: list[str] = []

    def found(self, name: str) -> None:
        if self.is_strict:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)
        if name not in self.names:
            self.names.append(name)


class Fields:
    """Reads fields of one JSON object; `prefix` names nested objects in errors (`stream_options.`).
    Nested objects read through `get_object` report unknown fields to the same `unknown`."""

    def __init__(self, body: object, prefix: str = "", unknown: UnknownFields | None = None) -> None:
        if not isinstance(body, dict):
            name = prefix.rstrip(".") or "the request body"
            raise bad_request(f"{name} must be a JSON object, got {_type_name(body)}", prefix.rstrip(".") or None)
        self._body: dict[str, object] = body
        self._prefix = prefix
        self._read: set[str] = set()
        self.unknown = UnknownFields(is_strict=True) if unknown is None else unknown

    def name(self, key: str) -> str:
        return self._prefix + key

    def raw(self, key: str) -> object:
        self._read.add(key)
        return self._body.get(key)

    def has(self, key: str) -> bool:
        return self._body.get(key) is not None

    def typed(self, key: str, check: Callable[[object], bool], type_name: str, default: T) -> T:
        value = self.raw(key)
        if value is None:
            return default
        if not check(value):
            raise bad_request(f"'{self.name(key)}' must be {type_name}, got {_type_name(value)}", self.name(key))
        return value  # type: ignore[return-value]

    def get_int(self, key: str, default: T, bounds: Bounds | None = None) -> int | T:
        value = self.typed(key, is_int, "an integer", default)
        if bounds is not None and is_int(value):
            self._check_bounds(key, value, bounds)  # type: ignore[arg-type]
        return value

    def get_float(self, key: str, default: T, bounds: Bounds | None = None) -> float | T:
        value = self.typed(key, is_number, "a number", default)
        if not is_number(value):
            return value
        if bounds is not None:
            self._check_bounds(key, value, bounds)  # type: ignore[arg-type]
        return float(value)  # type: ignore[arg-type]

    def get_bool(self, key: str, default: T) -> bool | T:
        return self.typed(key, lambda v: isinstance(v, bool), "a boolean", default)

    def get_str(self, key: str, default: T) -> str | T:
        return self.typed(key, lambda v: isinstance(v, str), "a string", default)

    def get_object(self, key: str) -> "Fields | None":
        value = self.raw(key)
        return None if value is None else Fields(value, self.name(key) + ".", self.unknown)

    def raw_items(self) -> dict[str, object]:
        """All fields, as they are (free-form objects such as chat_template_kwargs)."""
        self._read.update(self._body)
        return dict(self._body)

    def str_list(self, key: str) -> tuple[str, ...]:
        """A string or an array of strings (OpenAI's `stop`)."""
        value = self.raw(key)
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise bad_request(f"'{self.name(key)}' must be a string or an array of strings", self.name(key))

    def int_list(self, key: str) -> tuple[int, ...]:
        value = self.raw(key)
        if value is None:
            return ()
        if isinstance(value, list) and are_ints(value):
            return tuple(value)
        raise bad_request(f"'{self.name(key)}' must be an array of integers", self.name(key))

    def unsupported_unless(self, key: str, is_default: Callable[[object], bool], why: str) -> None:
        """A known OpenAI parameter this server does not implement: fine only at its default."""
        value = self.raw(key)
        if value is not None and not is_default(value):
            raise unsupported(self.name(key), why)

    def check_unknown(self) -> None:
        for key in self._body:
            if key not in self._read:
                self.unknown.found(self.name(key))

    def ignored_fields(self) -> tuple[str, ...]:
        """After a request body's last read: reports its fields nobody read, and returns the names of all the
        request's ignored fields (nested objects' ones included: they report to the same `unknown`)."""
        self.check_unknown()
        return tuple(self.unknown.names)

    def accept(self, *keys: str) -> None:
        """Fields that mean nothing here (OpenAI's `store`, a message's `annotations`): read, so
        they are neither an error nor reported, whatever their value."""
        self._read.update(keys)

    def _check_bounds(self, key: str, value: float, bounds: Bounds) -> None:
        """A range stated once in core (SamplingParams' fields, ...), checked here under the client's name."""
        if not bounds.admits(value):
            raise bad_request(f"'{self.name(key)}' must be {bounds}, got {value}", self.name(key))
