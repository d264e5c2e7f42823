"""Typed, named reads from a JSON request body: every wrong type or value is a 400 naming the field.

`null` means "the default" for every optional field, as in the OpenAI API. A `Fields` remembers
which keys were read, so that `reject_unknown()` can answer a key nobody reads with a 400.
Deliberate choice (OpenAI's, not vLLM's): an unknown argument is an error, never silently ignored.
JSON booleans are not numbers here, although Python's `bool` is an `int`.
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


class Fields:
    """Reads fields of one JSON object; `prefix` names nested objects in errors (`stream_options.`)."""

    def __init__(self, body: object, prefix: str = "") -> None:
        if not isinstance(body, dict):
            name = prefix.rstrip(".") or "the request body"
            raise bad_request(f"{name} must be a JSON object, got {_type_name(body)}", prefix.rstrip(".") or None)
        self._body: dict[str, object] = body
        self._prefix = prefix
        self._read: set[str] = set()

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
        return None if value is None else Fields(value, self.name(key) + ".")

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

    def reject_unknown(self) -> None:
        for key in self._body:
            if key not in self._read:
                raise bad_request(f"Unrecognized request argument supplied: {self.name(key)}", self.name(key))

    def _check_bounds(self, key: str, value: float, bounds: Bounds) -> None:
        """A range stated once in core (SamplingParams' fields, ...), checked here under the client's name."""
        if not bounds.admits(value):
            raise bad_request(f"'{self.name(key)}' must be {bounds}, got {value}", self.name(key))
