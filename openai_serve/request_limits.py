"""How much one request may ask for, checked on cheap measures before any costly work is done.

Two kinds of limit, each a 400 naming the field (no retry could help, so never a 503):
- Settings (flags): prompts per completions request, generations per request (prompts x n),
  stop strings per request and their length. They bound the work one request can ask for.
- What can never fit the context, known before tokenizing: a text of more characters than
  `max_prompt_chars` (the context length times the longest token of the vocabulary, in characters,
  times 4 where a normalizer may fold characters together) has more tokens than the context holds,
  as have more chat messages than the context has tokens (each message's role markers are at least
  one token in every chat template we know), or more token ids. Tokenizing or rendering such a
  request would only stall a CPU for seconds and grow the server's memory by gigabytes.

What can be counted is checked on the body as parsed, before its fields are read one by one
(`check_body`); the rest once they are (`check_generation`, `check_text`).
"""

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from openai_serve.errors import bad_request
from openai_serve.protocol.common import CommonRequest
from openai_serve.server_config import ServerConfig

# How many characters a normalizer (NFC, NFKC) may fold into one: Hangul jamo compose 3 to 1.
_NORMALIZER_FOLDING = 4


@dataclass(frozen=True)
class RequestLimits:
    max_prompts: int
    max_choices: int  # prompts x n
    max_stop_strings: int
    max_stop_string_length: int
    max_prompt_chars: int  # a longer text can never fit the context
    max_messages: int  # the context length: more chat messages, or token ids, can never fit

    @classmethod
    def of(cls, config: ServerConfig, max_model_len: int, tokenizer: PreTrainedTokenizerBase) -> "RequestLimits":
        return cls(
            max_prompts=config.max_prompts_per_request, max_choices=config.max_choices_per_request,
            max_stop_strings=config.max_stop_strings, max_stop_string_length=config.max_stop_string_length,
            max_prompt_chars=max_model_len * max_chars_per_token(tokenizer), max_messages=max_model_len,
        )

    def check_generation(self, num_prompts: int, common: CommonRequest, prompt_param: str) -> None:
        self._check_num_prompts(num_prompts, prompt_param)
        if num_prompts * common.n > self.max_choices:
            raise bad_request(f"{num_prompts} prompts x n={common.n} asks for {num_prompts * common.n} generations; "
                              f"at most {self.max_choices} are allowed per request (--max-choices-per-request)", "n")
        stop = common.sampling.stop
        self._check_num_stop_strings(len(stop))
        if stop and max(map(len, stop)) > self.max_stop_string_length:
            raise bad_request(f"a stop string is longer than {self.max_stop_string_length} characters "
                              "(--max-stop-string-length)", "stop")

    def check_text(self, num_chars: int, param: str) -> None:
        """A text of this many characters can fit the context."""
        if num_chars > self.max_prompt_chars:
            raise bad_request(f"'{param}' is {num_chars} characters long: more tokens than this model's context "
                              f"holds, whatever they are (at most {self.max_prompt_chars} characters can fit)", param)

    def check_body(self, body: object, prompt_key: str) -> None:
        """Before the body is read: what can be counted without reading its values. Stop strings, prompts
        (completions' `prompt`) and token ids over their limits, and messages (chat's `messages`, the
        Responses API's `input`) beyond what the context can hold, are refused before any per-item work."""
        if not isinstance(body, dict):
            return  # the request's own reading says what is wrong
        stop = body.get("stop")
        if isinstance(stop, list):
            self._check_num_stop_strings(len(stop))
        prompt = body.get(prompt_key)
        if isinstance(prompt, str):
            self.check_text(len(prompt), prompt_key)
        elif not isinstance(prompt, list) or not prompt:
            return
        elif prompt_key == "prompt":
            self._check_prompt_list(prompt)
        else:
            self._check_messages(prompt, prompt_key)

    def _check_prompt_list(self, prompt: list[object]) -> None:
        if isinstance(prompt[0], int) and len(prompt) >= self.max_messages:
            raise bad_request(f"'prompt' has {len(prompt)} tokens; this model's context holds at most "
                              f"{self.max_messages}", "prompt")
        if not isinstance(prompt[0], int):
            self._check_num_prompts(len(prompt), "prompt")

    def _check_num_prompts(self, num_prompts: int, param: str) -> None:
        if num_prompts > self.max_prompts:
            raise bad_request(f"'{param}' holds {num_prompts} prompts; at most {self.max_prompts} are allowed per "
                              "request (--max-prompts-per-request)", param)

    def _check_num_stop_strings(self, num_stop_strings: int) -> None:
        if num_stop_strings > self.max_stop_strings:
            raise bad_request(f"'stop' holds {num_stop_strings} strings; at most {self.max_stop_strings} are allowed "
                              "(--max-stop-strings)", "stop")

    def _check_messages(self, messages: list[object], key: str) -> None:
        if len(messages) > self.max_messages:
            raise bad_request(f"'{key}' holds {len(messages)} messages; this model's context holds at most "
                              f"{self.max_messages}", key)
        self.check_text(sum(_content_chars(m) for m in messages), key)


def max_chars_per_token(tokenizer: PreTrainedTokenizerBase) -> int:
    """Characters of text one token can stand for, at most: the longest token of the vocabulary as
    written in it (a byte-level token has one character per byte, which decodes to at most as many),
    times the folding of the tokenizer's normalizer (or of an unknown one)."""
    longest = max(map(len, tokenizer.get_vocab()), default=1)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    has_no_normalizer = backend is not None and backend.normalizer is None
    return longest * (1 if has_no_normalizer else _NORMALIZER_FOLDING)


def _content_chars(message: object) -> int:
    """The characters of a message's text content, which every chat template renders."""
    if not isinstance(message, dict):
        return 0
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        return sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0
