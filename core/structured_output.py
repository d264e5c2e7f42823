"""What a request's output must match (structured output): exactly one kind of constraint.

`SamplingParams.structured_output` holds one of these. The front ends build it (response_format,
vLLM's `structured_outputs`, tool_choice required/named); core/grammar.py compiles it with the
grammar engine and keeps each sequence's matcher. Frozen and hashable: it is the key of the
compiled-grammar cache, and it travels to the engine's process pickled.
"""

from dataclasses import dataclass, field, fields


class StructuredOutputError(ValueError):
    """A constraint that cannot be used: malformed, or rejected by the grammar engine. `param` names the
    request field it came from, as the caller's client knows it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class StructuredOutput:
    json_schema: str | None = None  # a JSON Schema, as JSON text
    json_object: bool = False  # any JSON object
    regex: str | None = None
    choice: tuple[str, ...] | None = None  # exactly one of these strings
    grammar: str | None = None  # EBNF (GBNF), as the grammar engine takes it
    # xgrammar's structural tag, as JSON text: free text until a trigger, then what the trigger opens (tool calls
    # in `auto` mode, built by the server's tool-call format)
    structural_tag: str | None = None
    # The request field the constraint came from, for errors (not part of the constraint: not compared).
    param: str = field(default="response_format", compare=False)

    def __post_init__(self) -> None:
        if self.choice is not None:
            object.__setattr__(self, "choice", tuple(self.choice))
        kinds = [f.name for f in fields(self) if f.name != "param" and getattr(self, f.name) not in (None, False)]
        if len(kinds) != 1:
            raise StructuredOutputError(self.param, f"exactly one kind of structured output must be given, got "
                                        f"{', '.join(kinds) or 'none'}")
        if self.choice is not None and (not self.choice or not all(isinstance(c, str) and c for c in self.choice)):
            raise StructuredOutputError(self.param, "choice must be a non-empty list of non-empty strings")
