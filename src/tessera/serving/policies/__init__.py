"""Pure serving policies, unit-tested in virtual time (no I/O, no clock, no global randomness)."""
