"""The Ray backend (``tessera up --backend ray``): Tessera decides, Ray executes. Needs the ``ray`` extra.

``backend.py`` (``RayBackend``), ``actor.py`` (one detached actor per workload, one per node of a gang across
nodes), ``watch.py`` (what ``poll`` follows: each actor's calls and logs, the workload's end), ``parts.py`` (a gang
across nodes: its parts and their handle fields), ``guard.py`` (the node-side process that leaves nothing of a
workload behind), ``nodes.py`` (how nodes and GPUs are declared to Ray), ``local_cluster.py`` (a single-host cluster
for a trial). See docs/ray.md.
"""
