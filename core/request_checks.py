"""Whether a request can ever be served by this engine: its prompt's token ids, its length, the
context and KV blocks it needs, the token ids its sampling names and a structured output that
compiles. The one statement of these rules; the front ends (the offline `LLM`, the server) check
every request with them before it reaches the engine, which checks them again at its door (a request
that slips through fails alone).

An error names the field as the caller's client knows it (`prompt`, `messages`, `max_tokens`,
`max_completion_tokens`): the caller says which, so nobody renames an error afterwards.
"""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from core.outputs import RequestRejected
from core.sampling_params import SamplingParams
from core.structured_output import StructuredOutputError


@dataclass(frozen=True)
class EngineLimits:
    vocab_size: int
    max_model_len: int
    block_size: int
    # The most KV-cache blocks one context may span (gpu/kv_cache_groups.py's context_block_limit): those that exist
    # in the full-attention group.
    num_blocks: int

    def check_token_ids(self, token_ids: Sequence[int], param: str) -> None:
        """Every id is one of the model's tokens."""
        if token_ids and not (min(token_ids) >= 0 and max(token_ids) < self.vocab_size):
            raise RequestRejected(param, f"token ids in '{param}' must be in [0, {self.vocab_size})")

    def check_prompt(self, prompt_token_ids: Sequence[int], param: str = "prompt") -> None:
        """Not empty, known tokens only, and room left to generate."""
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise RequestRejected(param, f"'{param}' must not be empty")
        self.check_token_ids(prompt_token_ids, param)
        if num_prompt >= self.max_model_len:
            raise RequestRejected(param, f"'{param}' has {num_prompt} tokens; this model's context length is "
                                  f"{self.max_model_len}, which leaves no room to generate")

    def check_pooled_prompt(self, prompt_token_ids: Sequence[int], param: str = "input") -> None:
        """A prompt to pool (an embedding, a score): not empty, known tokens only, within the context and the
        KV cache (its last token may end the context: nothing is generated after it)."""
        num_prompt = len(prompt_token_ids)
        if num_prompt == 0:
            raise RequestRejected(param, f"'{param}' must not be empty")
        self.check_token_ids(prompt_token_ids, param)
        if num_prompt > self.max_model_len:
            raise RequestRejected(param, f"'{param}' has {num_prompt} tokens; this model takes at most "
                                  f"{self.max_model_len}")
        if -(-num_prompt // self.block_size) > self.num_blocks:
            raise RequestRejected(param, f"'{param}' needs more KV-cache blocks than the {self.num_blocks} that exist")

    def max_tokens_of(self, num_prompt_tokens: int, params: SamplingParams) -> int:
        """max_tokens, where None means as many as the context leaves."""
        return params.max_tokens if params.max_tokens is not None else self.max_model_len - num_prompt_tokens

    def fit(self, num_prompt_tokens: int, params: SamplingParams, param: str = "max_tokens") -> SamplingParams:
        """`params` with max_tokens resolved for a checked prompt of this length; raises RequestRejected
        when prompt and output do not fit the context or the KV cache, or its sampling cannot run."""
        self.check_sampling(params)
        return self._fit_length(num_prompt_tokens, params, param)

    def check_sampling(self, params: SamplingParams) -> None:
        """The token ids it names are the model's; a structured output compiles (the reason otherwise,
        under the request field it came from)."""
        self.check_sampled_token_ids(params)
        if params.structured_output is not None:
            from core import grammar  # noqa: PLC0415 - xgrammar is imported by the first request that needs it

            try:
                grammar.check(params.structured_output)
            except StructuredOutputError as exc:
                raise RequestRejected(exc.param, str(exc)) from exc

    def check_sampled_token_ids(self, params: SamplingParams) -> None:
        """Every token id the sampling names is the model's: the sampler indexes the logits with them."""
        self.check_token_ids(params.stop_token_ids, "stop_token_ids")
        self.check_token_ids([token_id for token_id, _ in params.logit_bias], "logit_bias")

    def refusal(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> str | None:
        """The engine's own check at its door, of a request its front end checked: why it cannot run, or
        None. All of the above but compiling a structured output (the engine compiles it anyway, and a
        request whose grammar fails to compile ends alone)."""
        try:
            self.check_prompt(prompt_token_ids)
            self.check_sampled_token_ids(params)
            self._fit_length(len(prompt_token_ids), params, "max_tokens")
        except RequestRejected as exc:
            return str(exc)
        return None

    def _fit_length(self, num_prompt_tokens: int, params: SamplingParams, param: str) -> SamplingParams:
        max_tokens = self.max_tokens_of(num_prompt_tokens, params)
        if num_prompt_tokens + max_tokens > self.max_model_len:
            raise RequestRejected(param, f"the prompt ({num_prompt_tokens} tokens) + '{param}' ({max_tokens}) "
                                  f"exceeds the context length of {self.max_model_len} tokens")
        num_blocks = -(-(num_prompt_tokens + max_tokens) // self.block_size)
        if num_blocks > self.num_blocks:
            raise RequestRejected(param, f"the request needs {num_blocks} KV-cache blocks, more than the "
                                  f"{self.num_blocks} that exist")
        return params if params.max_tokens == max_tokens else replace(params, max_tokens=max_tokens)

    def check(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> SamplingParams:
        """Both checks, for a caller whose client names the fields `prompt` and `max_tokens`."""
        self.check_prompt(prompt_token_ids)
        return self.fit(len(prompt_token_ids), params)
