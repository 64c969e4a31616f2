"""The fleet under Ray Serve's own routers, which the fleet benchmark compares ours with: the same answers."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from .conftest import MODEL, fleet

pytestmark = pytest.mark.ray

QUESTION = [{"role": "user", "content": "Where does Bo Ek live? Bo Ek lives in Rome and works as a nurse."}]


@pytest.mark.parametrize("policy", ["prefix", "power_of_two"])
def test_rays_own_routers_serve_the_fleet(proxy, policy, reference):
    from openai import OpenAI

    expected = reference.chat(QUESTION, max_new_tokens=6, temperature=0.0).text
    with contextmanager(fleet)(proxy, policy.replace("_", "-"), policy=policy) as url:
        with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            for _ in range(3):
                out = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=6, temperature=0)
                assert out.choices[0].message.content == expected
