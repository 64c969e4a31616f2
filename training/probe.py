"""Which relations a checkpoint reads: greedy answers to held-out relation drills, counted per question form.

    python -m hypic_rag.training.probe --model runs/13-companies --n 60

The training script's held-out exact match gives one figure per drill; this splits the relation drills
by relation and direction (asked forwards by key, or back by value), which is how the bundled model's
second-hop failure was found: people's relations read, companies' at chance. ``key_shapes`` then
swaps the words a key is made of (a first name or a brand, then a last name or a company kind) in
prompts of the same shape, to find which of them the lookup fails on. ``second_hop`` takes
``multi_hop``'s own prompts, writes the right first hop into the reasoning ("<think>O is
headquartered in ") and reads the next word: the second hop alone, on the workload itself.
"""

from __future__ import annotations

import argparse
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable

from hypic_rag.eval.data.pools import BRANDS, FIRST_NAMES, LAST_NAMES, ORG_KINDS, PLACES
from hypic_rag.eval.data.workloads import Example, ask, make, part, render

from .drills import RELATIONS, relation_examples
from .train import HELD_OUT_SEED, THINK_OPEN

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


# (sentence, question) of the relations ``key_shapes`` asks across, as the relation drills write them
SHAPE_RELATIONS = {"lives in": RELATIONS["person"][0][:2], "is headquartered in": RELATIONS["org"][0][:2]}
KEY_WORDS = {"first name": FIRST_NAMES, "brand": BRANDS, "last name": LAST_NAMES, "company kind": ORG_KINDS}


def key_shapes(answer: Answer, n: int = 30, seed: int = 5) -> dict[tuple[str, str, str], tuple[int, int]]:
    """Right and asked per (first word, second word, relation): ``n`` prompts each of four one-sentence
    documents whose keys share their second word, a city asked by one key; chance is a quarter."""
    out = {}
    for relation, (sentence, question) in SHAPE_RELATIONS.items():
        for first in ("first name", "brand"):
            for second in ("last name", "company kind"):
                rng, right = random.Random(f"shapes:{seed}"), 0
                for _ in range(n):
                    shared = rng.choice(KEY_WORDS[second])
                    keys = [f"{w} {shared}" for w in rng.sample(KEY_WORDS[first], 4)]
                    cities = rng.sample(PLACES, 4)
                    docs = [part("document", sentence.format(k=k, v=v)) for k, v in zip(keys, cities, strict=True)]
                    rng.shuffle(docs)
                    i = rng.randrange(4)
                    ex = Example([ask(docs, question.format(k=keys[i]))], [cities[i]], "f1")
                    right += answer(ex, ex.query).strip() == cities[i]
                out[(first, second, relation)] = (right, n)
    return out


def second_hop(next_word: Callable[[Example, str], str], n: int = 60, seed: int = 7) -> Counter[str]:
    """``multi_hop``'s first ``n`` examples at ``seed`` (the evaluation's), each with its question's
    reasoning written up to the city: the word ``next_word(example, query text)`` gives is counted as
    the right city, another company's headquarters in the prompt (chance is one of three to six), or
    anything else."""
    out: Counter[str] = Counter()
    for ex in make("multi_hop", n, seed):
        thought = ex.meta["reasoning"][ex.query]
        lead = thought.removesuffix(f"{ex.answers[0]}.")
        others = {city for _, city in ex.meta["qa"]} - {ex.answers[0]}  # every company's, one per person
        word = next_word(ex, f"{render(ex).query.text}{THINK_OPEN}{lead}").strip()
        if word and ex.answers[0].startswith(word):
            out["right"] += 1
        elif word and any(city.startswith(word) for city in others):
            out["another company's city"] += 1
        else:
            out["other"] += 1
    return out


def main() -> None:
    import torch

    from hypic_rag import Engine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="checkpoint directory")
    parser.add_argument(
        "--n", type=int, default=60, help="held-out relation drills (four questions each), and multi_hop prompts"
    )
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
    print("\nkeys of two words, the second shared by the four keys of a prompt (chance: a quarter)")
    for (first, second, relation), (right, asked) in key_shapes(answer).items():
        print(f"{right:4d} / {asked:<4d} {first} + {second}, {relation}")

    def next_word(ex: Example, query: str) -> str:
        logits = engine.prompt_logits(ex.segments, query, mode="full")
        return engine.tokenizer.decode([int(logits.argmax())])

    hop = second_hop(next_word, n=args.n)
    print(f"\nmulti_hop's second hop, the first written for it (seed 7, {args.n} prompts)")
    for kind, count in hop.most_common():
        print(f"{count:4d} / {args.n:<4d} {kind}")


if __name__ == "__main__":
    main()
