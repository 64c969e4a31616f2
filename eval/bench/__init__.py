"""Benchmarks on random-weight checkpoints, sharing one scaffolding (``common``).

- ``ttft``: ``hypic-rag bench``, TTFT of each mode and of transformers on the standard case.
- ``sweeps``: ``hypic-rag bench --sweep NAME``, TTFT across one dimension.
- ``runtime``: ``hypic-rag bench --runtime``, the runtime's prefill against transformers'.
- ``slo``: ``hypic-rag bench --slo``, throughput under a TTFT SLO, by simulation.
- ``kernels``: ``python -m hypic_rag.eval.bench.kernels``, the GPU benchmark.
- ``measure``: ``python -m hypic_rag.eval.bench.measure``, HYPIC's fidelity and speed measurements.
"""
