"""What every route needs, built once at start-up and read-only afterwards (but for the stores it
holds: stored responses, names of ignored fields already logged)."""

import time
from dataclasses import dataclass, field

from starlette.requests import Request
from transformers import PreTrainedTokenizerBase

from core.detokenizer import TokenDecoder
from core.sampling_defaults import SERVER_DEFAULTS
from core.sampling_params import SamplingParams
from core.serving_engine import ServingEngine
from openai_serve.chat_template import ChatTemplate
from openai_serve.cpu_work import CpuWork
from openai_serve.engine_bridge import EngineBridge
from openai_serve.errors import model_not_found
from openai_serve.ignored_fields import IgnoredFieldsLog
from openai_serve.logprobs import TokenTexts
from openai_serve.metrics import ServerMetrics
from openai_serve.request_limits import RequestLimits
from openai_serve.response_store import ResponseStore
from openai_serve.server_config import ServerConfig


@dataclass(frozen=True)
class ServingState:
    bridge: EngineBridge
    config: ServerConfig
    tokenizer: PreTrainedTokenizerBase
    chat_template: ChatTemplate
    token_texts: TokenTexts
    token_decoder: TokenDecoder  # the tokenizer's decode, as cheap as it gets (token_decoder.py)
    responses: ResponseStore  # the Responses API's stored responses (mutable, the event loop's only)
    metrics: ServerMetrics
    limits: RequestLimits  # what one request may ask for, checked before costly work
    cpu_work: CpuWork  # where tokenizing and rendering large inputs happens, off the event loop
    tool_call_parser: str | None = None  # --tool-call-parser resolved against the template (None: no parsing)
    reasoning_parser: str | None = None  # --reasoning-parser (None: thinking is not split from the answer)
    # What the sampling fields a request leaves out take (--generation-config: the model's, by default).
    sampling_defaults: SamplingParams = SERVER_DEFAULTS
    ignored_fields: IgnoredFieldsLog = field(default_factory=IgnoredFieldsLog)
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def engine(self) -> ServingEngine:
        """The engine now serving (a failed one is replaced by a new one of the same config)."""
        return self.bridge.engine

    @property
    def model_names(self) -> tuple[str, ...]:
        return self.config.served_model_names

    def check_model(self, model: str | None) -> None:
        """Any served name selects the model; None (allowed on /tokenize) means it too."""
        if model is not None and model not in self.model_names:
            raise model_not_found(model)


def serving_state(request: Request) -> ServingState:
    return request.app.state.serving
