"""The chat page at `/`: static HTML, CSS and JavaScript from openai_serve/web/, no build step and
nothing from elsewhere (no CDN). It talks to this server's own API (/v1/models, streamed
/v1/chat/completions) like any client. `--no-web-ui` leaves these routes out.

The page and its files need no API key (a browser sends none when it loads a page); the API calls
the page makes carry the key the user types in.
"""

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

WEB_DIR = Path(__file__).parent / "web"
ASSETS_PREFIX = "/ui"


async def chat_page(request: Request) -> Response:
    return FileResponse(WEB_DIR / "index.html", headers={"Cache-Control": "no-cache"})


WEB_UI_ROUTES = [
    Route("/", chat_page, methods=["GET"]),
    Mount(ASSETS_PREFIX, StaticFiles(directory=WEB_DIR), name="ui"),
]


def is_web_ui_path(path: str) -> bool:
    return path == "/" or path.startswith(ASSETS_PREFIX + "/")
