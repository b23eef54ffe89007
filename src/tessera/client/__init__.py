"""The HTTP client of Tessera's API, used by the CLI (``tessera submit``, ``jobs``, ``show``, ...)."""
