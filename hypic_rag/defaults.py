"""The serving limits every driver starts from (the scheduler, the shared in-process batch, the server, the fleet,
the command line), written once; importable without torch, so the command line's help reads them cheaply."""

MAX_ACTIVE = 16  # requests decoded together, in one forward a step
MAX_NUM_BATCHED_TOKENS = 2048  # tokens a scheduler step runs: a token of each decode, the rest prompt pieces
MAX_QUEUE = 64  # requests the server holds waiting; past that, 429
QUEUE_TIMEOUT_S = 120.0  # seconds a request may wait for the engine; past that, a timeout
# What decode steps read (``Engine.from_pretrained(weights=...)``, ``--weights``).
WEIGHTS = ("float32", "int8", "bfloat16")
