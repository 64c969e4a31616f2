"""Helpers for tests and benchmarks: random-weight checkpoints built with transformers' own classes,
and parity checks against them. The only part of the package that needs ``transformers``."""
