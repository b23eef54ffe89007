"""Where workloads really run. ``base.Backend`` is the one seam the server talks to; ``fake`` is an in-memory backend
for tests, ``local`` runs real processes on this host."""
