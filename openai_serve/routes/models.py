"""GET /v1/models, /v1/models/{model}, /health, /version and /metrics (see openai_serve/metrics.py)."""

from starlette.requests import Request
from starlette.responses import Response

from openai_serve import __version__
from openai_serve.errors import model_not_found
from openai_serve.metrics import CONTENT_TYPE
from openai_serve.routes.responding import json_response
from openai_serve.state import ServingState, serving_state


def _model_card(state: ServingState, name: str) -> dict[str, object]:
    # `root` is the model every served name stands for, by its first served name: vLLM puts the model's
    # path there, which tells every client where the server keeps its files.
    return {"id": name, "object": "model", "created": state.created, "owned_by": "openai-serve",
            "root": state.model_names[0], "max_model_len": state.engine.max_model_len}


async def list_models(request: Request) -> Response:
    state = serving_state(request)
    return json_response({"object": "list", "data": [_model_card(state, n) for n in state.model_names]})


async def retrieve_model(request: Request) -> Response:
    state = serving_state(request)
    name = request.path_params["model"]
    if name not in state.model_names:
        raise model_not_found(name)
    return json_response(_model_card(state, name))


async def health(request: Request) -> Response:
    """200 while the engine serves (its process or thread, and the bridge's output thread); 503 naming the
    state otherwise: the engine failed and is restarting (`engine_restarting`), failed for good
    (`engine_failed`), or the server is shutting down."""
    bridge = serving_state(request).bridge
    refusal = bridge.refusal()
    if refusal is not None:
        raise refusal
    return json_response({"status": "ok", "engine_restarts": bridge.num_restarts})


async def version(request: Request) -> Response:
    """The server's version, as vLLM's GET /version answers it."""
    return json_response({"version": __version__})


async def metrics(request: Request) -> Response:
    """Prometheus text format. At idle: num_kv_blocks_used is 0 and free + evictable = all blocks."""
    return Response(serving_state(request).metrics.exposition(), media_type=CONTENT_TYPE)
