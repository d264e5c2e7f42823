"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, code a string or null;
on Anthropic's Messages API (`/v1/messages...`) in its shape: `{"type": "error", "error": {"type",
"message"}}`, the type named by the status as Anthropic names it, and an overloaded server (503
elsewhere) answers 529, `overloaded_error`, as Anthropic's does.

Every failure a client can cause is an `APIError` raised where it is found and turned into a JSON
response by one handler (`error_response`, which picks the shape by the path); anything else that
escapes is logged and answered as a 500 in the same shape (a bug, never a crash of the server).
"""

import logging

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from core import RequestRejected, SamplingParamsError

logger = logging.getLogger(__name__)

ANTHROPIC_PATH = "/v1/messages"
# Anthropic's error types by HTTP status; any other 4xx is an invalid request, any other 5xx an API error.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                    503: "overloaded_error"}
_ANTHROPIC_OVERLOADED_STATUS = 529


class APIError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        closes_connection: bool = False,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.error_type = error_type
        self.param = param
        self.code = code
        self.closes_connection = closes_connection  # the rest of the request is not read: the connection ends

    def to_dict(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    def to_anthropic_dict(self) -> dict[str, object]:
        default = "invalid_request_error" if self.status_code < 500 else "api_error"
        return {"type": "error", "error": {"type": _ANTHROPIC_TYPES.get(self.status_code, default),
                                           "message": self.message}}

    def to_response(self, is_anthropic: bool = False) -> Response:
        """As a JSON response, in Anthropic's shape and status where `is_anthropic`, else OpenAI's."""
        headers = {"Retry-After": "1"} if self.status_code == 503 else {}
        if self.closes_connection:
            headers["Connection"] = "close"
        if not is_anthropic:
            return Response(orjson.dumps(self.to_dict()), self.status_code, headers, "application/json")
        status = _ANTHROPIC_OVERLOADED_STATUS if self.status_code == 503 else self.status_code
        return Response(orjson.dumps(self.to_anthropic_dict()), status, headers, "application/json")


def is_anthropic_path(path: str) -> bool:
    """Whether a path is Anthropic's Messages API (its errors are in its shape)."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


def error_response(error: APIError, path: str) -> Response:
    """`error` as the response to a request for `path`, in the shape of the API it belongs to."""
    return error.to_response(is_anthropic_path(path))


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def refused(exc: RequestRejected | SamplingParamsError) -> APIError:
    """A request core's rules refuse, as a 400; the error already names the client's field."""
    return bad_request(str(exc), exc.param)


def unsupported(param: str, why: str = "is not supported by this server") -> APIError:
    return APIError(400, f"'{param}' {why}", param=param, code="unsupported_parameter")


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def service_unavailable(message: str, code: str) -> APIError:
    return APIError(503, message, error_type="service_unavailable_error", code=code)


def unauthorized() -> APIError:
    message = "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'."
    return APIError(401, message, code="invalid_api_key")


def duplicate_header(name: str) -> APIError:
    return APIError(400, f"The request has more than one {name} header: send one.", code="duplicate_header")


def request_too_large(limit: int) -> APIError:
    return APIError(413, f"The request body exceeds the limit of {limit} bytes.", code="request_too_large")


async def handle_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    return error_response(exc, request.url.path)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (unknown route) and 405 (wrong method), in OpenAI's shape."""
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(APIError(exc.status_code, message, code=codes.get(exc.status_code)), request.url.path)


async def handle_unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unexpected error on %s %s", request.method, request.url.path, exc_info=exc)
    error = APIError(500, "The server had an error while processing your request.", error_type="server_error")
    return error_response(error, request.url.path)
