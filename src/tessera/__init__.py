"""Tessera: intelligent, fractional, multi-tenant GPU scheduling for AI workloads."""

__version__ = "0.1.0"
