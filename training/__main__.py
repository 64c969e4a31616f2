"""``python -m hypic_rag.eval.train``: the training script (see ``hypic_rag.eval.train.train``)."""

from .train import main

main()
