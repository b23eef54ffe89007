"""The ``tessera`` command: thin typer + rich adapters over ``tessera.client``, ``tessera.sim`` and
``tessera.server``.

Modules: ``main`` (the typer app, the simulate, bench and up commands, and ``main``, the console-script entry
point), ``commands`` (the API commands: submit, jobs, show, logs, cancel, nodes, queues, token create), ``settings``
(where the server and its token are found: flags, environment, config file), ``specfile`` (``submit -f``'s YAML
spec) and ``terminal`` (one-line errors and exit code 2). ``python -m tessera.cli`` runs the command too.
"""
