"""`--reasoning-parser`: the model's thinking, written in `<think>...</think>` (`[THINK]...[/THINK]` for
Mistral's), goes to the message's `reasoning_content` (and `reasoning`, vLLM's newer name), the rest to
its content. Named as vLLM names them: `qwen3` (Qwen3, Qwen3.5), `deepseek_r1`, `deepseek_v3` (V3.1
with thinking on), `glm45`, `kimi_k2`, `mistral` (Magistral); gpt-oss's channels are `harmony`'s
(harmony.py), which `openai_gptoss` names too.

Where an answer starts is read from the prompt the chat template made: a prompt that ends inside an
open `<think>` (DeepSeek-R1's, GLM-4.7's and newer Qwen templates open it) starts in reasoning; one that
ends with a closed, empty block (Qwen3 with `enable_thinking: false`, DeepSeek V3.1 without thinking)
is all content. Otherwise the answer's start tells (`<think>` or not), except that `deepseek_r1`
starts in reasoning (its models often leave the opening tag out). Thinking that never closes (the
answer hit max_tokens) is all reasoning, as in vLLM. Whitespace between the end tag and the content is
dropped.
"""

from enum import Enum

from openai_serve.parsers.deltas import MessageDelta
from openai_serve.parsers.stepping import SteppingParser
from openai_serve.parsers.tags import split_at_tag

START = "<think>"
END = "</think>"
# Each parser's tags; gpt-oss's analysis channel is read by the harmony parser, under both of its names.
TAGS = {name: (START, END) for name in ("qwen3", "deepseek_r1", "deepseek_v3", "glm45", "kimi_k2")}
TAGS["mistral"] = ("[THINK]", "[/THINK]")
HARMONY_NAMES = ("harmony", "openai_gptoss")
PARSER_CHOICES = (*TAGS, *HARMONY_NAMES)
# Those whose tags are special tokens, which the text of an answer leaves out unless told to keep them.
NEEDS_SPECIAL_TOKENS = frozenset({"mistral", "glm45", "kimi_k2"})


class _State(Enum):
    START = "start"  # has the answer opened a <think> block? (whitespace or part of the tag so far)
    REASONING = "reasoning"
    CONTENT_START = "content start"  # whitespace after </think> is dropped
    CONTENT = "content"


class ReasoningParser(SteppingParser):
    def __init__(self, parser_name: str, prompt: str) -> None:
        if parser_name not in TAGS:
            raise ValueError(f"unknown reasoning parser {parser_name!r}; one of {', '.join(TAGS)}")
        super().__init__()
        self._start, self._end = TAGS[parser_name]
        prompt_end = prompt.rstrip()
        self._state = _State.START
        self._starts_in_reasoning = parser_name == "deepseek_r1" or prompt_end.endswith(self._start)
        if prompt_end.endswith(self._end):
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
        if rest.startswith(self._start):
            self._pending, self._state = rest[len(self._start):], _State.REASONING
            return True
        if not rest or self._start.startswith(rest):
            return False
        self._state = _State.REASONING if self._starts_in_reasoning else _State.CONTENT
        return True

    def _read_reasoning(self, deltas: list[MessageDelta]) -> bool:
        before, tag, after = split_at_tag(self._pending, self._end)
        if before:
            deltas.append(MessageDelta(reasoning=before))
        self._pending = after
        if tag is None:
            return False
        self._state = _State.CONTENT_START
        return True
