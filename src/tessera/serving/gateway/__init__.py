"""The OpenAI-compatible gateway: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and
``/v1/models`` in front of the model replicas, with the part-1 router, the hold-from-zero queue and tenant keys.

Seams the serving controller plugs into: ``registry.ReplicaRegistry`` (which models exist, whose they are, and
which replicas of each are ready), ``auth.Authenticator`` (API key -> tenant) and ``GatewayConfig.on_demand`` (a
model needs a replica: the controller scales it up). ``app.Gateway`` is the ASGI application.
"""
