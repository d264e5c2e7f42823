"""`--reasoning-parser`: the model's thinking, written in `<think>...</think>`, goes to the message's
`reasoning_content` (and `reasoning`, vLLM's newer name), the rest to its content.

Where an answer starts is read from the prompt the chat template made: a prompt that ends inside an
open `<think>` (DeepSeek-R1's and newer Qwen templates open it) starts in reasoning; one that ends
with a closed, empty block (Qwen3 with `enable_thinking: false`) is all content. Otherwise `qwen3`
looks at how the answer starts (`<think>` or not), and `deepseek_r1` starts in reasoning (its
models often leave the opening tag out). Thinking that never closes (the answer hit max_tokens) is
all reasoning, as in vLLM. Whitespace between `</think>` and the content is dropped.
"""

from enum import Enum

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.stepping import SteppingParser
from openai_serve.parsers.tags import split_at_tag

START = "<think>"
END = "</think>"
PARSER_CHOICES = ("qwen3", "deepseek_r1")


class _State(Enum):
    START = "start"  # has the answer opened a <think> block? (whitespace or part of the tag so far)
    REASONING = "reasoning"
    CONTENT_START = "content start"  # whitespace after </think> is dropped
    CONTENT = "content"


class ReasoningParser(SteppingParser):
    def __init__(self, parser_name: str, prompt: str) -> None:
        if parser_name not in PARSER_CHOICES:
            raise ValueError(f"unknown reasoning parser {parser_name!r}; one of {', '.join(PARSER_CHOICES)}")
        super().__init__()
        prompt_end = prompt.rstrip()
        self._state = _State.START
        self._starts_in_reasoning = parser_name == "deepseek_r1" or prompt_end.endswith(START)
        if prompt_end.endswith(END):
            self._state = _State.CONTENT

    def finish(self) -> list[MessageDelta]:
        pending = self._take_pending()
        if not pending or self._state is _State.CONTENT_START:
            return []
        is_reasoning = self._state is _State.REASONING or (self._state is _State.START and self._starts_in_reasoning)
        return [MessageDelta(reasoning=pending) if is_reasoning else MessageDelta(content=pending)]

    def _step(self, deltas: list[MessageDelta]) -> bool:
        if self._state is _State.START:
            return self._read_start()
        if self._state is _State.REASONING:
            return self._read_reasoning(deltas)
        if self._state is _State.CONTENT_START:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return False
            self._state = _State.CONTENT
        return self._send_content(deltas)

    def _read_start(self) -> bool:
        rest = self._pending.lstrip()
        if rest.startswith(START):
            self._pending, self._state = rest[len(START):], _State.REASONING
            return True
        if not rest or START.startswith(rest):
            return False
        self._state = _State.REASONING if self._starts_in_reasoning else _State.CONTENT
        return True

    def _read_reasoning(self, deltas: list[MessageDelta]) -> bool:
        before, tag, after = split_at_tag(self._pending, END)
        if before:
            deltas.append(MessageDelta(reasoning=before))
        self._pending = after
        if tag is None:
            return False
        self._state = _State.CONTENT_START
        return True
