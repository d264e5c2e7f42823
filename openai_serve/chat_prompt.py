"""A chat request made ready for the engine: the chat template's prompt as token ids, and how its
answers are read (tool-call and reasoning parsers). Chat completions and the Responses API both
come through here, so a conversation is prompted and parsed the same way whichever API carries it.
"""

from dataclasses import dataclass

from openai_serve.parsers.selection import OutputParsing
from openai_serve.protocol.chat import ChatRequest
from openai_serve.state import ServingState


@dataclass(frozen=True)
class ChatPrompt:
    token_ids: list[int]
    parsing: OutputParsing


def chat_prompt(state: ServingState, body: ChatRequest) -> ChatPrompt:
    text = state.chat_template.render(body)
    parsing = OutputParsing(body.tools, state.tool_call_parser, state.reasoning_parser, text)
    return ChatPrompt(state.chat_template.tokenize(text), parsing)
