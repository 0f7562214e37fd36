"""Turn boundaries and anchor-state keys of trajectories, for turn-level advantage estimators.

Two things an estimator cannot recover from padded token tensors alone:

* **Turn ids** ``[B, T]`` (long): the turn of every policy-sampled token (the action tokens of a
  trajectory, whatever ``loss_mask`` says: a truncated trajectory masked out of the loss keeps its
  turns, so that it still counts in its group's statistics), and -1 on prompt, environment,
  template and padding tokens.
* **Anchor keys**: for every trajectory, one string per turn number (index = turn), naming the
  state the agent was in *before* that turn's action. Trajectories of one task whose turns have
  equal keys were in the same state there, which is what GiGPO's step-level groups compare
  (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training", arXiv 2505.10978).

The key of turn ``k`` is, in this order of preference:

1. ``"env:" + observation.info["state_key"]`` when the environment's observation that answered the
   previous action (turn ``k - 1``) carries a string ``state_key``, and for turn 0
   ``"env:" + EpisodeStart.info["state_key"]`` (recorded as ``Trajectory.start_info``): the
   environment knows its own state (a room, a board, the set of documents retrieved so far) and two
   different histories may reach the same one;
2. otherwise ``"tok:"`` + a 128-bit BLAKE2b digest of the token ids of everything before the turn's
   first action token: the prompt, every earlier action, observation and template token. That is
   the exact state of Agent-R1's MDP (the whole interaction history, token for token), so two
   trajectories share it exactly when the agent saw the same thing.

An environment that names its states should name the initial one too (in ``reset``): keys of the
two kinds never match each other, so without it a return to the initial state never shares a step
group with turn 0 (verl-agent groups by the observation, which gives the same result). Hashing is
incremental (one pass over the tokens
of the trajectory), so the keys cost about as much as reading the token ids once.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

import torch

from agent_r1.mdp import TokenSource, Trajectory

__all__ = ["STATE_KEY", "anchor_keys", "turn_ids"]

STATE_KEY = "state_key"
"""The ``Observation.info`` key through which an environment names its own state."""


def turn_ids(
    trajectories: Sequence[Trajectory], length: int, device: torch.device | None = None
) -> torch.Tensor:
    """``[B, length]`` long: the turn of each policy token, -1 elsewhere (right padding included).
    ``length`` must be at least the longest trajectory."""
    out = torch.full((len(trajectories), length), -1, dtype=torch.long)
    for row, trajectory in enumerate(trajectories):
        position = 0
        for segment in trajectory.segments:
            end = position + len(segment.token_ids)
            if segment.source is TokenSource.POLICY:
                out[row, position:end] = segment.turn
            position = end
        if position > length:
            raise ValueError(f"trajectory {trajectory.id!r} has {position} tokens, more than length={length}")
    return out.to(device) if device is not None else out


def anchor_keys(trajectory: Trajectory) -> list[str]:
    """One key per turn number ``0 .. last action turn`` naming the state before that turn's action
    (see the module docstring); ``""`` for a turn number without action tokens."""
    env_keys: dict[int, str] = {}
    start_key = trajectory.start_info.get(STATE_KEY)
    if isinstance(start_key, str):
        env_keys[0] = f"env:{start_key}"
    for step in trajectory.steps:
        info = step.observation.info if step.observation is not None else {}
        key = info.get(STATE_KEY)
        if isinstance(key, str):
            env_keys[step.turn + 1] = f"env:{key}"
    keys: dict[int, str] = {}
    digest = hashlib.blake2b(digest_size=16)
    for segment in trajectory.segments:
        if segment.source is TokenSource.POLICY and segment.turn not in keys:
            keys[segment.turn] = env_keys.get(segment.turn) or f"tok:{digest.hexdigest()}"
        digest.update(array("q", segment.token_ids).tobytes())
    last = max(keys, default=-1)
    return [keys.get(turn, "") for turn in range(last + 1)]
