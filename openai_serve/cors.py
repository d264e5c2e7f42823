"""Starlette's CORS middleware, with its refusals in OpenAI's error shape.

A preflight whose origin, method or headers are not allowed gets Starlette's 400, as JSON here
(browsers only read its status; a developer's tools read the body).
"""

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from openai_serve.errors import APIError


class OpenAICORSMiddleware(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code != 400:
            return response
        error = APIError(400, f"{bytes(response.body).decode()} (--allowed-origins)", code="cors_refused")
        refusal = error.to_response()
        for name, value in response.headers.items():
            if name not in ("content-type", "content-length"):
                refusal.headers[name] = value
        return refusal
