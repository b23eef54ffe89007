"""The ``tessera`` command: thin typer + rich adapters over ``tessera.client``, ``tessera.sim`` and
``tessera.server``.

Modules: ``main`` (the typer app with the list of subcommands, the simulate, bench and up commands, and ``main``,
the console-script entry point), ``lazy`` (the root group that imports a subcommand's module when it is named),
``lean_typer`` (typer's pydantic and the Markdown and Pygments of its rich help, loaded when used), ``commands`` (the
API commands: submit, jobs, show, nodes, token) with ``logs``, ``job_control`` (cancel, hold, release), ``history``,
``queues`` and ``models`` beside it, ``settings`` (where the server and its token are found: flags, environment,
config file), ``specfile`` (``submit -f``'s YAML spec) and ``terminal`` (one-line errors and exit code 2).
``python -m tessera.cli`` runs the command too.
"""
