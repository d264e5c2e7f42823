"""Offline generation: `LLM(model).generate(prompts, params)` runs the engine to completion.

Prompts are strings (tokenized here, the engine never tokenizes) or lists of token ids.
"""

from dataclasses import dataclass, field

from core.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from core.detokenizer import IncrementalDetokenizer
from core.engine import LLMEngine
from core.outputs import FinishReason, RequestOutput
from core.sampling_params import SamplingParams
from gpu.batch import TokenLogprobs

Prompt = str | list[int]


@dataclass
class GenerationOutput:
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    text: str = ""


class LLM:
    def __init__(
        self,
        model: str | None = None,
        *,
        cache: CacheConfig | None = None,
        scheduler: SchedulerConfig | None = None,
        **model_options: object,
    ) -> None:
        """`model`: a checkpoint directory; None builds and uses the built-in tiny model.
        `model_options` are ModelConfig fields (dtype, device, max_model_len, ...)."""
        if model is None:
            from core.tiny_model import default_model_dir

            model = str(default_model_dir())
        config = EngineConfig(
            model=ModelConfig(model=model, **model_options),  # type: ignore[arg-type]
            cache=cache or CacheConfig(), scheduler=scheduler or SchedulerConfig(),
        )
        self.engine = LLMEngine(config)
        self.tokenizer = self.engine.tokenizer

    def generate(
        self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[GenerationOutput]:
        prompt_list = _as_prompt_list(prompts)
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompt_list)
        if len(params_list) != len(prompt_list):
            raise ValueError(f"{len(prompt_list)} prompts but {len(params_list)} sampling params")
        token_lists = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt_list]
        checked = [self.engine.limits.check(ids, p) for ids, p in zip(token_lists, params_list, strict=True)]
        results: dict[str, GenerationOutput] = {}
        detokenizers: dict[str, IncrementalDetokenizer] = {}
        for index, (token_ids, p) in enumerate(zip(token_lists, checked, strict=True)):
            self.engine.add_request(str(index), token_ids, p.for_engine())
            results[str(index)] = GenerationOutput(prompt_token_ids=token_ids)
            detokenizers[str(index)] = IncrementalDetokenizer(
                self.tokenizer, token_ids, p.stop, skip_special_tokens=p.skip_special_tokens,
                include_stop_str_in_output=p.include_stop_str_in_output)
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                self._absorb(out, results[out.request_id], detokenizers[out.request_id])
        for result, detok in zip(results.values(), detokenizers.values(), strict=True):
            detok.flush()
            result.text = detok.text
        return list(results.values())

    def _absorb(self, out: RequestOutput, result: GenerationOutput, detok: IncrementalDetokenizer) -> None:
        """Adds one step's tokens; a stop string ends the sequence after the token that completed it."""
        if detok.is_stopped:
            return  # the abort's own final output, or tokens generated before the abort landed
        for token_id, logprobs in zip(out.new_token_ids, out.new_logprobs, strict=True):
            result.token_ids.append(token_id)
            result.logprobs.append(logprobs)
            detok.add_tokens([token_id])
            if detok.is_stopped:
                result.finish_reason = FinishReason.STOP
                self.engine.abort_request(out.request_id)
                return
        result.finish_reason = out.finish_reason


def _as_prompt_list(prompts: Prompt | list[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and isinstance(prompts[0], int):
        return [prompts]  # type: ignore[list-item]
    return list(prompts)  # type: ignore[arg-type]
