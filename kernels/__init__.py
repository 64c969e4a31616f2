"""Fused kernels for the operations HYPIC adds (transition, compose, stitch), each beside its torch
reference. Installed as ``hypic_rag.kernels``; never importable as a top-level ``kernels``."""
