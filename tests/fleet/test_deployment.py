"""The fleet's application for a cluster of one's own: the example Serve config is valid and builds the fleet."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "serve_config.yaml"


def test_the_example_serve_config_is_valid_and_builds_the_fleet(monkeypatch):
    from ray import serve
    from ray.serve.schema import ServeDeploySchema

    from hypic_rag.fleet.deployment import app_builder

    config = yaml.safe_load(CONFIG.read_text())
    schema = ServeDeploySchema.model_validate(config)
    assert schema.http_options.port == 8000
    (application,) = config["applications"]
    module, _, name = application["import_path"].partition(":")
    assert (module, name) == ("hypic_rag.fleet.deployment", "app_builder")
    monkeypatch.setenv("HYPIC_API_KEY", "sk-from-the-environment")
    app = app_builder(application["args"])
    assert isinstance(app, serve.Application)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"policy": "nearest"}, "unknown routing policy 'nearest'"),
        ({"replicas": 0}, "replicas must be >= 1"),
        ({"num_replicas": 3}, "num_replicas: give replicas or autoscaling in args instead"),
        ({"stats_period_s": 0}, "stats_period_s must be a positive number"),
        ({"api_key": ""}, "api_key must not be empty"),
    ],
)
def test_bad_fleet_arguments_are_refused_before_anything_starts(args, message):
    from hypic_rag.fleet.deployment import app_builder

    with pytest.raises(ValueError, match=message):
        app_builder(args)


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (b'{"messages": [{"role": "user", "content": "Where does Bo Ek live?"}]}', "Where does Bo Ek live?"),
        (b'{"prompt": "Bo Ek lives in Rome.", "max_tokens": 2}', "Bo Ek lives in Rome."),
        (b'{"prompt": ["Bo Ek ", "lives."]}', "Bo Ek lives."),
        (b"[1, 2]", ""),
        (b"\xff", ""),
    ],
)
def test_rays_prefix_router_reads_the_text_the_ingress_hands_it(body, text):
    """Ray's router takes ``messages`` from any argument that has the attribute, so a completion's text must
    come without one (it raised "No request with message or prompt attribute" when both were there)."""
    from types import SimpleNamespace

    from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (
        PrefixCacheAffinityRouter,
    )

    from hypic_rag.fleet.deployment import request_text

    router = object.__new__(PrefixCacheAffinityRouter)  # its text extraction reads no routing state
    pending = SimpleNamespace(args=("POST", "/v1/x", "", [], body, request_text(body)))
    assert router._extract_text_from_request(pending) == text
