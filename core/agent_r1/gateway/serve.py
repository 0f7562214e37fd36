"""``agent-r1 serve-policy``: a standalone policy gateway.

Loads the policy as a run config says (``--config``, with ``--model`` for ``model.path``; without a
config the defaults apply: the ``hf`` backend, the model's own chat template, ``hermes`` tool
calls), builds the configured rollout backend and serves it until interrupted. Episodes open on
their first call (``/episodes/{id}/v1/...``, ``metadata.episode_id`` or ``user``); ``POST
/episodes/{id}/finish`` closes one and appends its trajectories to ``--out``. An episode with no
call, reward or show for ``--episode-idle-s`` (900 s by default; 0: never) is closed as failed and
appended too; a finished or closed id is never reopened (HTTP 409).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from agent_r1.config import ComponentSpec, load_config, validate_components
from agent_r1.errors import AgentR1Error

__all__ = ["serve_policy"]


def serve_policy(
    config_path: str | None,
    overrides: Sequence[str],
    *,
    model: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    tool_format: str | None = None,
    max_new_tokens: int | None = None,
    max_context: int | None = None,
    out: Path | None = None,
    episode_idle_s: float | None = 900.0,
) -> None:
    """Load the policy and serve it (see the module docstring). Everything that can be checked
    without the model (config, components, packages) is checked before it loads.
    ``episode_idle_s``: ``None`` or 0 never closes idle episodes."""
    from agent_r1.gateway.server import GatewaySettings, PolicyGateway, require_server_packages
    from agent_r1.gateway.training import served_model_name as default_name

    require_server_packages()
    config = load_config(config_path, [*overrides, *([f"model.path={model}"] if model else [])])
    gateway_config = config.rollout.gateway
    if tool_format is not None:
        gateway_config.tool_call_format = ComponentSpec(name=tool_format)
    config.rollout.source = "engine"  # serving, not training: no agent program to launch
    components = {c.path: c for c in validate_components(config)}
    from agent_r1.gateway.training import tool_call_format
    from agent_r1.registry import get_registry

    fmt = tool_call_format(gateway_config.tool_call_format, get_registry())
    if out is not None and out.exists() and out.is_dir():
        raise AgentR1Error(f"--out {out} is a directory; give a JSONL file to append trajectories to")
    if episode_idle_s is not None and episode_idle_s < 0:
        raise AgentR1Error(
            f"--episode-idle-s {episode_idle_s:g} is negative; give the seconds after which an idle "
            "episode is closed, or 0 to never close one"
        )
    idle_s = episode_idle_s or None

    from agent_r1.models.loading import load_policy, pick_device
    from agent_r1.rollout.templates import apply_chat_template_config

    loaded, tokenizer = load_policy(config.model, device=pick_device(config.model.device))
    tokenizer = apply_chat_template_config(tokenizer, config.model)
    backend_component = components["rollout.backend"]
    backend = backend_component.cls(backend_component.config, model=loaded, tokenizer=tokenizer)
    name = served_model_name or gateway_config.served_model_name or default_name(config.model.path)
    gateway = PolicyGateway(
        backend,
        tokenizer,
        fmt,
        GatewaySettings(
            served_model_name=name,
            max_new_tokens=max_new_tokens or config.rollout.max_new_tokens,
            max_context=max_context or config.rollout.max_context,
            request_timeout_s=gateway_config.request_timeout_s,
            batch_wait_s=gateway_config.batch_wait_s,
            open_on_demand=True,
            structured_output=gateway_config.structured_output,
            out=out,
            episode_idle_s=idle_s,
        ),
    )
    print(
        f"agent-r1 policy gateway: model {name!r} ({backend.name} backend, {fmt.name} tool calls) at "
        f"http://{host}:{port}/v1 ; per episode: http://{host}:{port}/episodes/<id>/v1"
        + (f" ; finished episodes go to {out}" if out else "")
        + (f" ; episodes idle for {idle_s:g} s are closed as failed" if idle_s else ""),
        file=sys.stderr,
        flush=True,
    )
    gateway.serve(host, port)
