"""Decoding strategies (experimental): how the rollout engine picks each turn's action.

The :class:`~agent_r1.rollout.loop.RolloutEngine` calls a :class:`TurnDecoder` once per turn for
all active episodes (``rollout.decoding`` / ``eval.decoding`` choose it; ``sample``, the default,
uses no decoder and is exactly the plain agent loop):

* ``value_guided``: each episode's prompt is sent ``K`` times in *one* batched backend call (the
  ``hf`` backend prefills identical prompts once), so every episode gets ``K`` independent
  samples; each candidate is scored by the trained critic in batched no-grad forwards, and the
  argmax is kept. The score of a candidate of ``n`` tokens is ``V(s_L)`` at its last token ``L``
  in the critic's own index convention (:mod:`agent_r1.engine.learner.critic`): the value head read at the
  hidden state of token ``L - 1``. That is the latest position of an action the critic was trained
  on; the hidden state of ``L`` itself never is (the token after an action is never a policy
  token), so reading there would rely on the head generalising to a position it never fitted.
* ``best_of_k``: the same ``K`` candidates, scored by a verifier (:func:`load_verifier`): the
  built-in ``format`` verifier gives 1 to an action the environment parses into a tool call or a
  final answer without errors and 0 otherwise (it needs no ground truth: it is a check the agent
  could run itself); a Python path ``module:function`` names any ``fn(action, messages) -> float``
  (a reward model, a self-check).

Ties go to the first candidate, i.e. to the sample plain decoding would have drawn with the same
seed (``K = 1`` reproduces plain sampling token for token). The trajectory keeps exactly the chosen
candidate's tokens and log-probabilities; the discarded candidates leave only their cost, counted
per episode in ``Trajectory.metrics`` (:data:`DECODING_METRICS`) and per call in
``RolloutEngine.last_metrics`` (``decoding/...``).

Training on value-guided or best-of-K rollouts is allowed (``rollout.decoding``), but the kept
actions are selected, not sampled from the policy: their log-probabilities are exact, yet the batch
is no longer on-policy, and nothing corrects for that selection. It is meant for evaluation.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agent_r1.contracts import Environment, Generation
from agent_r1.errors import AgentR1Error, ConfigError
from agent_r1.mdp import Action, Message
from agent_r1.rollout.decoder import TurnDecoder, TurnRequest

if TYPE_CHECKING:
    from torch import nn

    from agent_r1.config import DecodingConfig, RunConfig

__all__ = [
    "BestOfK",
    "ValueGuided",
    "build_decoder",
    "check_decoding",
    "format_verifier",
    "load_verifier",
]


Verifier = Callable[[Action, list[Message], Environment], float]
"""Scores one candidate action of an episode: ``(action, conversation so far, environment)``."""


class ValueGuided(TurnDecoder):
    """Keeps the candidate the critic values highest at its last token (see the module docstring).

    ``backbone`` is the model whose last hidden state the value head reads: the policy for a value
    head critic, the separate critic model otherwise. Identical candidates of an episode are scored
    once, and the prefix common to the turn's prompts goes through the critic once, its KV cache
    shared by every candidate."""

    kind = "value_guided"

    def __init__(
        self,
        candidates: int,
        value_head: nn.Module,
        backbone: nn.Module,
        *,
        pad_id: int,
        batch_size: int = 16,
    ) -> None:
        super().__init__(candidates)
        self.value_head, self.backbone = value_head, backbone
        self.pad_id, self.batch_size = pad_id, batch_size

    def score(
        self, request: TurnRequest, groups: list[list[Generation]]
    ) -> tuple[list[list[float]], list[float]]:
        from agent_r1.engine.learner.critic import shared_prefix_values

        # V(s_L), L a candidate's last token, is read from the hidden state of L - 1: the prompt and
        # every candidate token but the last (an empty candidate: the prompt). The prefix that all
        # of the turn's prompts share (system prompt, few-shot turns) goes through the critic once;
        # each candidate row is the rest of its prompt plus the candidate, identical rows once.
        shared = _common_prefix_length(request.prompts)
        rows: dict[tuple[int, ...], int] = {}
        where: list[list[int]] = []
        for prompt, group in zip(request.prompts, groups, strict=True):
            where.append([rows.setdefault((*prompt[shared:], *g.token_ids[:-1]), len(rows)) for g in group])
        was_training = self.backbone.training
        self.backbone.eval()  # no dropout noise in the scores
        try:
            values = shared_prefix_values(
                self.value_head,
                self.backbone,
                request.prompts[0][:shared],
                list(rows),
                pad_id=self.pad_id,
                batch_size=self.batch_size,
            )
        finally:
            if was_training:
                self.backbone.train()
        # Each episode is charged its own distinct rows and an equal share of the common prefix.
        lengths = [len(row) for row in rows]
        share = shared / max(len(groups), 1)
        scored = [share + sum(lengths[r] for r in set(episode_rows)) for episode_rows in where]
        return [[values[r] for r in episode_rows] for episode_rows in where], scored


def _common_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the token prefix all ``prompts`` share."""
    first = prompts[0]
    length = min(len(p) for p in prompts)
    for prompt in prompts[1:]:
        common = 0
        while common < length and prompt[common] == first[common]:
            common += 1
        length = common
    return length


class BestOfK(TurnDecoder):
    """Keeps the candidate a verifier scores highest (see :func:`load_verifier`)."""

    kind = "best_of_k"

    def __init__(self, candidates: int, verifier: Verifier) -> None:
        super().__init__(candidates)
        self.verifier = verifier

    def score(
        self, request: TurnRequest, groups: list[list[Generation]]
    ) -> tuple[list[list[float]], list[float]]:
        scores = []
        for i, group in enumerate(groups):
            budget = request.budgets[i]
            env, messages = request.envs[i], request.messages[i]
            scores.append([float(self.verifier(request.action_of(g, budget), messages, env)) for g in group])
        return scores, [0.0] * len(groups)


# --------------------------------------------------------------------------------------------
# Verifiers
# --------------------------------------------------------------------------------------------


def format_verifier(action: Action, messages: list[Message], env: Environment) -> float:
    """1.0 when ``env`` parses ``action`` into at least one tool call or a final answer without
    errors, else 0.0. Uses the environment's side-effect-free ``parse(action)`` (``ToolEnv`` and its
    presets, the calculator included); nothing runs."""
    parse = getattr(env, "parse", None)
    if parse is None:
        raise AgentR1Error(
            f"decoding.verifier='format' needs an environment with a parse(action) method (ToolEnv and "
            f"its presets have one); environment {env.name or type(env).__name__!r} has none. Give a "
            "verifier as a Python path, decoding.verifier=module:function, called as fn(action, messages)."
        )
    parsed = parse(action)
    return float(not parsed.errors and (bool(parsed.tool_calls) or parsed.answer is not None))


def load_verifier(spec: str, *, path: str = "decoding.verifier") -> Verifier:
    """The verifier ``spec`` names: ``format`` (:func:`format_verifier`) or a Python path
    ``module:function`` to ``fn(action, messages) -> float``. The module is imported as Python
    imports it; when that fails, once more with the working directory on ``sys.path``. Raises
    :class:`~agent_r1.errors.ConfigError` naming ``path`` when it cannot be found."""
    if spec == "format":
        return format_verifier
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ConfigError(f"{path}={spec!r}: expected 'format' or a Python path module:function", path=path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0] or os.getcwd() in sys.path:
            raise ConfigError(f"{path}={spec!r}: cannot import {module_name!r}: {exc}", path=path) from None
        sys.path.append(os.getcwd())  # a verifier file next to the run config, as for components
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as again:
            raise ConfigError(
                f"{path}={spec!r}: no module {module_name!r} (looked on sys.path and in the working "
                f"directory): {again}",
                path=path,
            ) from None
    target: Any = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{path}={spec!r}: module {module_name!r} has no {attribute!r}", path=path)
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"{path}={spec!r}: {attribute!r} is not callable", path=path)
    function: Callable[[Action, list[Message]], float] = target
    return lambda action, messages, _env: function(action, messages)


# --------------------------------------------------------------------------------------------
# Building from a session
# --------------------------------------------------------------------------------------------


def check_decoding(config: RunConfig, *, has_critic: bool | None) -> None:
    """Before a run loads a model: a verifier must be importable; decoding other than ``sample``
    needs the engine's agent loop (not ``rollout.source: gateway``, whose agent program picks its
    own actions); and a training run (``has_critic`` given) with ``value_guided`` in
    ``rollout.decoding`` or ``eval.decoding`` needs the critic its algorithm trains."""
    source = getattr(config.rollout, "source", "engine")
    for where, decoding in (("rollout", config.rollout.decoding), ("eval", config.eval.decoding)):
        if decoding.kind != "sample" and source == "gateway":
            raise ConfigError(
                f"{where}.decoding.kind={decoding.kind} needs the engine's agent loop, but "
                "rollout.source=gateway lets the agent program choose its actions; use "
                f"{where}.decoding.kind=sample with the gateway",
                path=f"{where}.decoding.kind",
            )
        if decoding.kind == "value_guided" and has_critic is False:
            raise ConfigError(
                f"{where}.decoding.kind=value_guided needs a trained critic, but algorithm "
                f"{config.algorithm.name!r} trains none. Use an algorithm with a critic "
                "(algorithm.name=ppo), or evaluate value-guided decoding after training with "
                "`agent-r1 eval ... eval.decoding.kind=value_guided --checkpoint RUN` on a run that "
                "trained one.",
                path=f"{where}.decoding.kind",
            )
        if decoding.kind == "best_of_k":
            load_verifier(decoding.verifier, path=f"{where}.decoding.verifier")


def build_decoder(session: Any, decoding: DecodingConfig, temperature: float) -> TurnDecoder | None:
    """The decoder of ``decoding`` over a session's critic, or ``None`` for plain sampling.

    At temperature 0 the ``K`` candidates would be one greedy action ``K`` times, so no decoder is
    built (the config refuses value_guided / best_of_k at temperature 0; this covers internal
    greedy rollouts such as ReMax's baseline)."""
    if decoding.kind == "sample" or temperature == 0.0:
        return None
    if decoding.kind == "best_of_k":
        return BestOfK(decoding.candidates, load_verifier(decoding.verifier))
    if session.value_head is None:
        raise AgentR1Error(
            "decoding.kind=value_guided: this session has no critic loaded; train with an algorithm "
            "that has one (algorithm.name=ppo), or evaluate a checkpoint of such a run"
        )
    unwrap = session.accelerator.unwrap_model
    backbone = unwrap(session.critic_model) if session.critic_model is not None else session.unwrapped
    return ValueGuided(
        decoding.candidates,
        unwrap(session.value_head),
        backbone,
        pad_id=session.pad_id,
        batch_size=decoding.critic_batch_size,
    )
