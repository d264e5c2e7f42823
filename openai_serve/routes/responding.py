"""What both generation endpoints do once their choices are in the engine: answer in full, or stream."""

import orjson
from starlette.requests import Request
from starlette.responses import Response

from openai_serve.generation import CollectedChoice, Generation, Usage, collect
from openai_serve.http_io import ClientDisconnected, until_disconnect

# nginx's "client closed request": never seen by the client, but it shows in access logs.
_CLIENT_CLOSED_REQUEST = 499


def json_response(payload: object, status_code: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code, media_type="application/json")


async def collect_or_abort(request: Request, generation: Generation) -> tuple[dict[int, CollectedChoice], Usage] | None:
    """Every choice in full; None if the client left first (its sequences are aborted then)."""
    try:
        choices = await until_disconnect(request, collect(generation))
    except ClientDisconnected:
        return None
    finally:
        generation.close()
    return choices, generation.usage()


def client_gone() -> Response:
    return Response(status_code=_CLIENT_CLOSED_REQUEST)
