"""What a browser gets from ``tessera up``: the dashboard at ``/ui`` and the API docs at ``/docs``, both served from
installed packages, so neither makes a request beyond this server (they work offline and behind a firewall).

- ``/ui``: the static files of ``tessera/server/dashboard`` (no build step). The dashboard reads only the public
  ``/v1`` API with the token the user pastes; the files themselves hold no data and need no token.
- ``/docs`` (Swagger UI) and ``/redoc`` (ReDoc): FastAPI's pages, with the scripts and styles of the
  ``fastapi-offline`` package (served under ``/docs/assets``) instead of FastAPI's defaults, which load them from a
  CDN (and ReDoc's fonts from Google). Only that package's files are used, not its ``FastAPI`` factory: the app is
  made as before. (``swagger-ui-bundle``, the other packaged Swagger UI, ships version 4, which cannot show the
  OpenAPI 3.1 documents FastAPI writes.)
- The OpenAPI document declares the bearer token as an HTTP security scheme, so that Swagger UI shows an Authorize
  button and sends the token. Only the document changes: the routes still read the ``Authorization`` header
  themselves (``routes.current_principal``), with the same errors as before.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DASHBOARD = Path(__file__).resolve().parent.parent / "dashboard"
DOCS_ASSETS = "/docs/assets"
BEARER = "bearer"


def docs_assets_dir() -> Path:
    """Where ``fastapi-offline`` keeps Swagger UI's and ReDoc's files."""
    return Path(str(resources.files("fastapi_offline") / "static"))


def mount(app: FastAPI) -> None:
    """Add ``/ui``, ``/docs`` and ``/redoc`` (with their assets) and the bearer scheme to ``app`` (made with
    ``docs_url=None`` and ``redoc_url=None``)."""
    app.mount("/ui", StaticFiles(directory=DASHBOARD, html=True), name="dashboard")
    app.mount(DOCS_ASSETS, StaticFiles(directory=docs_assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png",  # FastAPI's default is on its own web site
            # No validator badge: it would send the document to validator.swagger.io.
            swagger_ui_parameters={"persistAuthorization": True, "validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} API",
            redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png",
            with_google_fonts=False,
        )

    document = app.openapi

    def openapi() -> dict[str, Any]:
        return with_bearer_scheme(document())  # FastAPI caches the document: this edits the cached copy once

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend the document


def with_bearer_scheme(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with the bearer scheme declared, required by every ``/v1`` operation and optional on ``/metrics``
    (which answers without a token, with fewer series)."""
    schemes = doc.setdefault("components", {}).setdefault("securitySchemes", {})
    schemes[BEARER] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a token from `tessera up` (admin) or `tessera token create` (tenant)",
    }
    for path, operations in doc.get("paths", {}).items():
        for operation in operations.values():
            if path.startswith("/v1/"):
                operation["security"] = [{BEARER: []}]
            elif path == "/metrics":
                operation["security"] = [{}, {BEARER: []}]
    return doc
