"""Chat prompts: the model's chat template (or the one `--chat-template` names) through transformers.

`chat_template_kwargs` from a request become template variables (as do `reasoning_effort` and
`verbosity`); they can never replace the template or the arguments of `apply_chat_template` itself.
A request's tools go to the template as `tools`, in OpenAI's shape, as transformers expects them. The
rendered text already holds the template's special tokens, so it is tokenized without adding any (as
vLLM does).
"""

import inspect
import logging

from transformers import PreTrainedTokenizerBase

from openai_serve.errors import bad_request
from openai_serve.protocol.chat import ChatRequest

logger = logging.getLogger(__name__)


class ChatTemplate:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, template: str | None = None) -> None:
        self._tokenizer = tokenizer
        self._template = template
        parameters = inspect.signature(tokenizer.apply_chat_template).parameters
        self._reserved = {name for name, p in parameters.items() if p.kind is not p.VAR_KEYWORD} | {"messages"}

    @property
    def is_available(self) -> bool:
        return self._template is not None or getattr(self._tokenizer, "chat_template", None) is not None

    @property
    def text(self) -> str | None:
        """The template in use (a model's several named templates: all of them, joined)."""
        template = self._template or getattr(self._tokenizer, "chat_template", None)
        return "\n".join(template.values()) if isinstance(template, dict) else template

    def render(self, request: ChatRequest) -> str:
        if not self.is_available:
            # As vLLM: no default template is made up for a model without one (a base model, as a rule).
            raise bad_request("this model has no chat template (a base model?), so chat messages cannot be turned into "
                              "a prompt: send the text to /v1/completions, or start the server with --chat-template",
                              "messages")
        for key in request.template_kwargs:
            if key in self._reserved:
                name = f"chat_template_kwargs.{key}"
                raise bad_request(f"'{name}' is reserved and cannot be set by a request", name)
        try:
            return self._tokenizer.apply_chat_template(
                [dict(m) for m in request.messages], tools=request.tools.template_tools(),
                chat_template=self._template, tokenize=False,
                add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message, **request.template_kwargs,
            )
        except Exception as exc:  # a template's raise_exception, or variables it cannot use
            raise bad_request(f"the chat template could not render these messages: {exc}", "messages") from exc

    def tokenize(self, prompt: str) -> list[int]:
        return self._tokenizer.encode(prompt, add_special_tokens=False)

    def warm_up(self) -> None:
        """Renders and tokenizes one message now: transformers compiles a template on its first use, which the
        first request would otherwise wait for."""
        if not self.is_available:
            return
        try:
            self.tokenize(self._tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                              chat_template=self._template, add_generation_prompt=True))
        except Exception:  # noqa: BLE001 - a template that refuses this message is the requests' to report
            logger.debug("the chat template did not render a warm-up message", exc_info=True)
