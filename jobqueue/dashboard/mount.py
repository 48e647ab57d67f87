"""The dashboard under a path prefix of an ASGI app that cannot mount another (Django's ASGI
handler): one ASGI app that hands the prefix's requests to the dashboard and everything else,
its lifespan included, to the other app.

Starlette and FastAPI need none of this (``Mount("/jobs", app=...)``, ``app.mount``). The
scope is passed as Starlette's ``Mount`` passes it: ``path`` whole, the prefix added to
``root_path``, which is where the dashboard's links, forms and redirects start."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


def under_prefix(prefix: str, dashboard: ASGIApp, other: ASGIApp) -> ASGIApp:
    """An ASGI app serving ``dashboard`` at ``prefix`` (e.g. "/jobs") and ``other`` at every
    other path."""
    prefix = prefix.rstrip("/")
    if not prefix.startswith("/"):
        raise ValueError(f"the prefix must start with '/', not {prefix!r}")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            root: str = scope.get("root_path", "")
            path: str = scope["path"]
            route = path[len(root):] if root and path.startswith(root) else path
            if route == prefix or route.startswith(prefix + "/"):
                await dashboard({**scope, "root_path": root + prefix}, receive, send)
                return
        await other(scope, receive, send)

    return app
