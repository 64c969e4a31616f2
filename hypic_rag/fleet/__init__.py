"""A fleet of engine replicas behind one OpenAI-compatible ingress on Ray Serve, each request routed to the
replica expected to hold its segments. Needs the ``ray`` extra (``ray[serve]``) and the ``server`` extra."""

from __future__ import annotations

from typing import Any

__all__ = ["build_app", "default_autoscaling"]


def __getattr__(name: str) -> Any:
    # Ray is imported only when the fleet is asked for: ``hypic_rag.fleet.routing`` works without it.
    if name in __all__:
        from . import deployment

        return getattr(deployment, name)
    raise AttributeError(name)
