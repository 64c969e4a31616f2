"""Training the bundled model: the script (``train``, run as ``python -m hypic_rag.training``) and the drills it
trains on beside the workloads (``drills``). Apart from ``eval``, which measures any model and trains none; it
takes ``eval``'s workloads as its data."""
