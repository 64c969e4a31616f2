"""The evaluation data: the fictional world's pools, the synthetic workloads, the demo corpus, LongBench I/O."""

from .corpus import corpus
from .longbench import read_longbench_jsonl, write_longbench_jsonl
from .pools import World
from .workloads import TOOLS, WORKLOADS, Example, make

__all__ = ["TOOLS", "WORKLOADS", "Example", "World", "corpus", "make", "read_longbench_jsonl", "write_longbench_jsonl"]
