"""``python -m tessera.cli``: the ``tessera`` command."""

from tessera.cli.main import main

main()
