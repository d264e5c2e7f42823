"""A chat request made ready for the engine: the chat template's prompt as token ids, how its
answers are read (tool-call and reasoning parsers), and the request with the sampling those parsers
need (a lazy grammar for `auto` tool calls, special tokens kept where a format is written in them).
Chat completions and the Responses API both come through here, so a conversation is prompted and
parsed the same way whichever API carries it.

A large conversation is rendered and tokenized off the event loop (cpu_work.py), and a rendered
prompt with more characters than the context can hold as tokens is a 400 before it is tokenized.
"""

from dataclasses import dataclass, replace
from typing import Generic, TypeVar

from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.chat import ChatRequest
from openai_serve.state import ServingState

Request = TypeVar("Request", bound=ChatRequest)


@dataclass(frozen=True)
class ChatPrompt(Generic[Request]):
    token_ids: list[int]
    parsing: OutputParsing
    request: Request  # the request as it runs: its sampling as the parsers need it


async def chat_prompt(state: ServingState, body: Request) -> ChatPrompt[Request]:
    return await state.cpu_work.run(chat_work_size(body), lambda: _prepare(state, body))


def _prepare(state: ServingState, body: Request) -> ChatPrompt[Request]:
    """Rendering, tokenizing and building the tools' grammar: the work a large request sends to a thread."""
    text, token_ids = render_and_tokenize(state, body)
    parsing = OutputParsing(body.tools, state.tool_call_parser, state.reasoning_parser, text)
    sampling = parsing.sampling(body.common.sampling)
    if sampling is not body.common.sampling:
        body = replace(body, common=replace(body.common, sampling=sampling))
    return ChatPrompt(token_ids, parsing, body)


def render_and_tokenize(state: ServingState, body: ChatRequest) -> tuple[str, list[int]]:
    """The prompt's text through the chat template, and its tokens (unless it is longer than can fit)."""
    text = state.chat_template.render(body)
    state.limits.check_text(len(text), body.prompt_param)
    return text, state.chat_template.tokenize(text)


def chat_work_size(body: ChatRequest) -> int:
    """About how much text rendering the messages makes, to decide whether it is worth a thread."""
    content = sum(len(m["content"]) for m in body.messages if isinstance(m.get("content"), str))
    return content + 256 * len(body.messages) + 4096 * len(body.tools.tools)
