from __future__ import annotations

import torch

from hypic_rag.decoding import Sampler


def test_greedy_is_argmax():
    assert Sampler().pick(torch.tensor([0.1, 3.0, 2.0]), None) == 1


def test_top_p_keeps_the_smallest_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    sampler = Sampler(temperature=1.0, top_p=0.8, seed=0)
    gen = sampler.generator(torch.device("cpu"))
    picks = {sampler.pick(logits, gen) for _ in range(300)}
    assert picks == {0, 1}  # 0.5 + 0.3 reaches 0.8; the tail is cut
