"""Evaluation harness and benchmarks, installed as ``hypic_rag.eval``."""
