"""`GET /` and `GET /web/{file}`: the page and its scripts and styles, read from the package's
static folder (server/web/static, installed with the package: no build step, nothing fetched
from elsewhere at run time).

These paths are open even when API keys are set (the page has to load to ask for a key); it
holds no data, and every route it calls for data is protected as usual.
"""
from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Route

from server.errors import NotFound

STATIC = Path(__file__).resolve().parent / "static"
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
               ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
# Scripts and styles from this server only: a page that holds an API key loads nothing else.
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; "
                               "base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # revalidate: an upgraded server's page is seen at once
    "Referrer-Policy": "no-referrer",
}


def static_files() -> dict[str, Path]:
    """URL path → file, for every file the page may load."""
    files = {"/": STATIC / "index.html"}
    for path in sorted(STATIC.rglob("*")):
        if path.is_file() and path.suffix in MEDIA_TYPES:
            files["/web/" + path.relative_to(STATIC).as_posix()] = path
    return files


def page_routes() -> tuple[list[Route], frozenset[str]]:
    """The routes, and their paths (to leave open when keys are set)."""
    files = static_files()

    async def serve(request: Request) -> Response:
        path = files.get(request.url.path)
        if path is None:
            raise NotFound(f"no file {request.url.path} in the web page")
        return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=HEADERS)

    return ([Route("/", serve, methods=["GET"]), Route("/web/{file:path}", serve, methods=["GET"])],
            frozenset(files))
