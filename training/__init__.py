"""Training the bundled model: the script (``train``, run as ``python -m hypic_rag.eval.train``) and
the recall drills it trains on first (``drills``)."""
