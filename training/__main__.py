"""``python -m hypic_rag.training``: the training script (see ``hypic_rag.training.train``)."""

from .train import main

main()
