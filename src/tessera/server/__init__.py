"""The control plane behind ``tessera up``: the durable store, the scheduler loop on a wall clock, the HTTP API."""
