"""The episode endpoints of a :class:`~agent_r1.gateway.server.PolicyGateway`.

``POST /episodes`` opens an episode (standalone server), ``GET /episodes/{id}`` shows its calls
and trajectories so far, ``POST /episodes/{id}/reward`` adds a reward signal and
``POST /episodes/{id}/finish`` closes it and returns its trajectories (appended to the server's
``--out`` file too). In a training run the trainer opens and finishes the episodes itself
(:mod:`agent_r1.gateway.training`); agents may still post rewards.

An episode id is used once: once the episode is finished (or closed for idleness, see
:meth:`~agent_r1.gateway.server.PolicyGateway.close_idle`), each of these endpoints, and every
call, answers HTTP 409 on its id (:class:`~agent_r1.gateway.protocol.ConflictError`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agent_r1.gateway.protocol import RequestError
from agent_r1.mdp import RewardSignal, Task, Trajectory

if TYPE_CHECKING:  # pragma: no cover
    from agent_r1.gateway.server import PolicyGateway

__all__ = ["finish_episode", "open_episode", "post_reward", "show_episode"]

REWARD_FIELDS = frozenset({"value", "name", "kind", "completion_id", "weight"})
"""The fields a ``POST /episodes/{id}/reward`` body may hold."""


def open_episode(gateway: PolicyGateway, body: Any) -> dict[str, Any]:
    """``POST /episodes``: open an episode (standalone server only); an id that has ended is
    refused (HTTP 409)."""
    if not gateway.settings.open_on_demand:
        raise RequestError("in a training run the trainer opens the episodes", code="training_gateway")
    body = body if isinstance(body, dict) else {}
    task = None
    if body.get("task") is not None:
        try:
            task = Task.model_validate(body["task"])
        except ValueError as exc:
            raise RequestError(f"task: {exc}", param="task") from None
    episode = gateway.recorder.open(body.get("id"), task=task)
    return {"id": episode.id, "base_url": gateway.episode_url(episode.id) if gateway.url else None}


def show_episode(gateway: PolicyGateway, episode_id: str) -> dict[str, Any]:
    """``GET /episodes/{id}``: the calls and trajectories of an open episode so far."""
    episode = gateway.recorder.find(episode_id)
    trajectories = gateway.recorder.assemble(episode)
    return {
        "id": episode.id,
        "calls": len(episode.calls),
        "segments": len(episode.chains),
        "counters": dict(episode.counters),
        "trajectories": _as_json(trajectories),
    }


def post_reward(gateway: PolicyGateway, episode_id: str, body: Any) -> dict[str, Any]:
    """``POST /episodes/{id}/reward``: ``{"value", "name"?, "kind"?, "completion_id"?, "weight"?}``;
    a ``process`` reward needs the ``completion_id`` (response id) of the call it rewards."""
    if not isinstance(body, dict) or "value" not in body:
        raise RequestError('the body must be a JSON object with a numeric "value"', param="value")
    unknown = sorted(set(body) - REWARD_FIELDS)
    if unknown:
        raise RequestError(f"unrecognized field(s): {', '.join(unknown)}", param=unknown[0])
    kind = body.get("kind", "outcome")
    completion_id = body.get("completion_id")
    if kind == "process" and not completion_id:
        raise RequestError(
            "a process reward needs the completion_id of the call it rewards", param="completion_id"
        )
    episode = gateway.recorder.find(episode_id)
    try:
        signal = RewardSignal(
            name=str(body.get("name") or "reward"),
            value=body["value"],
            kind=kind,
            turn=0 if kind == "process" else None,  # the call's turn, set when the episode is assembled
            weight=body.get("weight", 1.0),
            source="gateway",
        )
    except ValueError as exc:
        raise RequestError(f"invalid reward: {exc}") from None
    gateway.recorder.add_reward(episode, signal, completion_id)
    return {"ok": True}


def finish_episode(gateway: PolicyGateway, episode_id: str, body: Any) -> dict[str, Any]:
    """``POST /episodes/{id}/finish``: ``{"answer"?}``; closes the episode (standalone server) and
    returns its trajectories, once: finishing it again is HTTP 409."""
    if not gateway.settings.open_on_demand:
        raise RequestError("in a training run the trainer finishes the episodes", code="training_gateway")
    body = body if isinstance(body, dict) else {}
    answer = body.get("answer")
    episode = gateway.recorder.find(episode_id)
    trajectories = gateway.recorder.finish(episode, answer=None if answer is None else str(answer))
    if episode.calls:
        gateway.save_finished(trajectories)
    return {"id": episode.id, "trajectories": _as_json(trajectories)}


def _as_json(trajectories: Sequence[Trajectory]) -> list[Any]:
    return [json.loads(t.to_json_line()) for t in trajectories]
