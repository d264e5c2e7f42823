"""The Starlette application: routes, middleware, error handlers, and the lifespan that runs the
engine bridge (its output thread, and the engine's process or thread: started before the first
request, stopped after the last connection closed) and the periodic stats line."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.routing import Route
from transformers import PreTrainedTokenizerBase

from core.sampling_defaults import load_sampling_defaults
from core.sampling_params import SamplingParams
from core.serving_engine import ServingEngine
from core.tokenizer import load_tokenizer
from openai_serve.chat_template import ChatTemplate
from openai_serve.cors import OpenAICORSMiddleware
from openai_serve.cpu_work import CpuWork
from openai_serve.engine_bridge import EngineBridge
from openai_serve.engine_restarts import RestartPolicy
from openai_serve.errors import APIError, handle_api_error, handle_http_exception, handle_unexpected
from openai_serve.logprobs import TokenTexts
from openai_serve.metrics import ServerMetrics
from openai_serve.middleware import APIKeyMiddleware, BodySizeLimitMiddleware
from openai_serve.parsers.selection import resolve_tool_call_parser
from openai_serve.request_limits import RequestLimits
from openai_serve.request_log import REQUEST_ID_HEADER, RequestLogMiddleware
from openai_serve.response_store import ResponseStore
from openai_serve.routes.anthropic import count_tokens, create_message
from openai_serve.routes.chat import create_chat_completion
from openai_serve.routes.completions import create_completion
from openai_serve.routes.embeddings import create_embedding
from openai_serve.routes.models import health, list_models, metrics, retrieve_model, version
from openai_serve.routes.responses import (
    cancel_response,
    create_response,
    delete_response,
    list_input_items,
    retrieve_response,
)
from openai_serve.routes.scores import create_rerank, create_score
from openai_serve.routes.tokenize import detokenize, tokenize
from openai_serve.server_config import ServerConfig
from openai_serve.state import ServingState
from openai_serve.stats_log import log_stats
from openai_serve.token_decoder import token_decoder
from openai_serve.web_ui import WEB_UI_ROUTES

logger = logging.getLogger(__name__)

ROUTES = [
    Route("/v1/completions", create_completion, methods=["POST"]),
    Route("/v1/chat/completions", create_chat_completion, methods=["POST"]),
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", cancel_response, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", list_input_items, methods=["GET"]),
    Route("/v1/embeddings", create_embedding, methods=["POST"]),
    Route("/v1/score", create_score, methods=["POST"]),
    *(Route(path, create_rerank, methods=["POST"]) for path in ("/v1/rerank", "/rerank", "/v2/rerank")),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
]


def build_app(
    engine: ServingEngine, config: ServerConfig, tokenizer: PreTrainedTokenizerBase | None = None,
    sampling_defaults: SamplingParams | None = None,
) -> Starlette:
    """An app serving `engine`, which runs while the app's lifespan does (and is closed after it).
    `tokenizer`: the model's (None: loaded from the engine's model config); the engine knows token ids only.
    `sampling_defaults`: what requests' sampling fields default to (None: as the engine's model config says)."""
    model = engine.config.model
    if tokenizer is None:
        tokenizer = load_tokenizer(model.tokenizer or model.model)
    if sampling_defaults is None:
        sampling_defaults = load_sampling_defaults(model.model, model.generation_config,
                                                   model.override_generation_config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        restarts = RestartPolicy(0 if config.exit_on_engine_failure else config.max_engine_restarts)
        # The engine is replaced when it fails and restarts: what the metrics read is the bridge's current one.
        metrics = ServerMetrics(config.served_model_names[0], engine.max_model_len, lambda: bridge.engine.stats(),
                                lambda: bridge.num_pending_requests)
        bridge = EngineBridge(engine, config.max_pending_requests, restarts, config.max_unread_steps,
                              metrics.record_engine)
        chat_template = ChatTemplate(tokenizer, config.chat_template)
        chat_template.warm_up()
        tool_call_parser = resolve_tool_call_parser(config.tool_call_parser, chat_template.text)
        reasoning_parser = None if config.reasoning_parser == "none" else config.reasoning_parser
        logger.info("tool-call parser: %s; reasoning parser: %s", tool_call_parser, reasoning_parser)
        responses = ResponseStore(config.responses_store_max_entries, config.responses_store_max_age_s)
        cpu_work = CpuWork()
        app.state.serving = ServingState(
            bridge, config, tokenizer, chat_template, TokenTexts(tokenizer), token_decoder(tokenizer), responses,
            metrics, limits=RequestLimits.of(config, engine.max_model_len, tokenizer), cpu_work=cpu_work,
            tool_call_parser=tool_call_parser, reasoning_parser=reasoning_parser, sampling_defaults=sampling_defaults,
        )
        bridge.start()
        stats_logger = asyncio.create_task(log_stats(lambda: bridge.engine.stats(), config.stats_log_interval_s))
        try:
            yield
        finally:
            stats_logger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stats_logger
            responses.close()
            await bridge.stop()
            cpu_work.close()

    routes = ROUTES + WEB_UI_ROUTES if config.web_ui else ROUTES
    return Starlette(
        routes=routes, middleware=_middleware(config, engine.max_model_len), lifespan=lifespan,
        exception_handlers={APIError: handle_api_error, HTTPException: handle_http_exception,
                            Exception: handle_unexpected},
    )


def _middleware(config: ServerConfig, max_model_len: int) -> list[Middleware]:
    middleware = [Middleware(RequestLogMiddleware)]  # outermost: it sees every answer, 401s and 413s too
    if config.allowed_origins:
        middleware.append(Middleware(OpenAICORSMiddleware, allow_origins=list(config.allowed_origins),
                                     allow_methods=["*"], allow_headers=["*"], expose_headers=[REQUEST_ID_HEADER]))
    if config.api_key is not None:
        middleware.append(Middleware(APIKeyMiddleware, api_key=config.api_key))
    middleware.append(Middleware(BodySizeLimitMiddleware, max_bytes=config.body_limit(max_model_len)))
    return middleware
