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
