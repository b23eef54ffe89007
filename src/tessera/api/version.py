"""``API_VERSION``: the version of the HTTP API's wire format (the ``/v1`` routes and their bodies).

It changes only when a change breaks existing clients (a field removed or retyped, a route gone); adding a field
with a default or a new route keeps it. The server reports it in ``GET /healthz`` (``api_version``) and as the
OpenAPI document's ``info.version``; ``TesseraClient.api_version()`` reads it.
"""

API_VERSION = "1"
