"""Evaluation, installed as ``hypic_rag.eval``: the data (``data``), the harness and its metrics and
report, the benchmarks (``bench``) and the training script of the bundled model (``train``)."""
