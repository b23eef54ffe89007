"""Test-suite settings: Hypothesis runs without per-example deadlines (timing is never a pass/fail criterion here;
CI machines are shared and a slow example is not a failure)."""

from hypothesis import settings

settings.register_profile("tessera", deadline=None, print_blob=True)
settings.load_profile("tessera")
