"""Unknown request fields: ignored, as vLLM ignores them, but never silently.

Each field name is logged once per server (with list indices folded: `messages[].mood`), so a chat
UI that sends Ollama's options on every request warns once, not on every request; and every
response names the request's ignored fields in its `X-Ignored-Fields` header, so a client can see
what had no effect. Names are escaped to printable ASCII (a header cannot carry more), and both the
header and the log are bounded, whatever a body holds.
"""

import logging
import re

from starlette.responses import Response

logger = logging.getLogger(__name__)

HEADER = "X-Ignored-Fields"
_MAX_NAMES_IN_HEADER = 32
_MAX_NAMES_LOGGED = 1024
_INDEX = re.compile(r"\[\d+\]")


class IgnoredFieldsLog:
    def __init__(self) -> None:
        self._logged: set[str] = set()

    def note(self, names: tuple[str, ...]) -> None:
        for name in names:
            key = _INDEX.sub("[]", name)
            if key in self._logged or len(self._logged) > _MAX_NAMES_LOGGED:
                continue
            self._logged.add(key)
            if len(self._logged) > _MAX_NAMES_LOGGED:
                logger.warning("more than %d distinct unknown request fields: no longer logging new ones",
                               _MAX_NAMES_LOGGED)
                continue
            logger.warning("ignoring the unknown request field %s (said once; responses name ignored fields in "
                           "their %s header; --strict-request-fields makes them a 400)", _printable(key), HEADER)


def name_ignored_fields(response: Response, names: tuple[str, ...]) -> Response:
    if names:
        shown = [_printable(name) for name in names[:_MAX_NAMES_IN_HEADER]]
        more = len(names) - len(shown)
        response.headers[HEADER] = ", ".join(shown) + (f", and {more} more" if more else "")
    return response


def _printable(name: str) -> str:
    return name.encode("unicode_escape").decode("ascii")
