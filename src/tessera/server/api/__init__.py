"""The HTTP API (FastAPI): ``/v1`` routes, bearer-token auth, JSON errors that name the field."""
