"""Which relations a checkpoint reads: greedy answers to held-out relation drills, counted per question form.

    python -m hypic_rag.eval.train.probe --model runs/13-companies --n 60

The training script's held-out exact match gives one figure per drill; this splits the relation drills
by relation and direction (asked forwards by key, or back by value), which is how the bundled model's
second-hop failure was found: people's relations read, companies' at chance.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Callable, Iterable

from ..data.workloads import Example
from .drills import RELATIONS, relation_examples
from .train import HELD_OUT_SEED

Answer = Callable[[Example, str], str]


def question_forms() -> list[tuple[re.Pattern[str], str]]:
    """Each relation's two questions as a pattern and the form it is counted under."""
    forms = []
    for relations in RELATIONS.values():
        for _, forward, back, _ in relations:
            for template, slot in ((forward, "{k}"), (back, "{v}")):
                forms.append((re.compile(re.escape(template).replace(re.escape(slot), ".+")), template))
    return forms


def by_form(examples: Iterable[Example], answer: Answer, per_example: int = 4) -> dict[str, tuple[int, int]]:
    """Right and asked per question form, over the first ``per_example`` questions of each example."""
    forms = question_forms()
    right, asked = Counter(), Counter()
    for ex in examples:
        for question, expected in ex.meta["qa"][:per_example]:
            form = next(template for pattern, template in forms if pattern.fullmatch(question))
            asked[form] += 1
            right[form] += answer(ex, question).strip() == expected
    return {form: (right[form], asked[form]) for form in sorted(asked)}


def main() -> None:
    import torch

    from hypic_rag import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument("--n", type=int, default=60, help="held-out relation drills (four questions each)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.n < 1:
        raise ValueError(f"--n must be at least 1, got {args.n}")
    torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.model)

    def answer(ex: Example, question: str) -> str:
        return engine.chat(ex.asking(question), max_new_tokens=16, mode="full").text

    # held out: the training script's held-out seed, shifted so these are not its EM examples either
    counts = by_form(relation_examples(args.n, HELD_OUT_SEED + 1), answer)
    for form, (right, asked) in counts.items():
        print(f"{right:4d} / {asked:<4d} {form}")
    print(f"{sum(r for r, _ in counts.values()):4d} / {sum(a for _, a in counts.values()):<4d} all")


if __name__ == "__main__":
    main()
