"""Embed agent-r1's engine in a hand-written training loop.

agent-r1's own trainer (``agent-r1 train``) is one way to run the RL cycle; this script is the
other: your loop, agent-r1's parts. Each step

1. rolls out tasks with :class:`~agent_r1.rollout.loop.RolloutEngine` and the ``hf`` backend
   (:class:`~agent_r1.builtins.hf_backend.HFBackend`) sampling from the model being trained;
2. scores the trajectories with a reward shaper;
3. pads them into tensors (:func:`~agent_r1.engine.learner.batch.collate`): input ids, the loss mask
   (policy tokens only), token rewards, rollout log-probabilities, group ids;
4. computes advantages with an estimator, the per-token loss with a policy loss, and reduces it
   with :func:`agent_r1.engine.learner.loss_utils.aggregate` (the framework owns the normalisation);
5. takes an optimizer step and tells the backend the weights changed.

Components come from the registry by name, as a run config would name them: the estimator
(``grpo``), the loss (``ppo_clip``) and the task (the toy target-character task of
:mod:`agent_r1.testing.toy`, registered in-process the way an embedder registers its own plugin
module). The policy is a tiny random model built in memory, so the script runs in seconds on a
CPU; with a real checkpoint, load it with ``agent_r1.models.loading.load_policy``.

Run::

    python sdk/examples/embedding/train_loop.py --steps 10

Each step prints one JSON line of metrics: ``reward`` (mean score) climbs from about 0.01 to
near 1 within ten steps; ``logprob_gap`` (largest difference between the sampler's and the
trainer's log-probability of a policy token, same weights) stays near 1e-6.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from typing import Any

import torch

import agent_r1.testing.toy as toy
from agent_r1 import AdvantageInput, LossInput, SamplingParams
from agent_r1.builtins.hf_backend import HFBackend
from agent_r1.engine.learner.batch import collate, policy_forward
from agent_r1.engine.learner.loss_utils import Normalizer, aggregate, masked_mean
from agent_r1.registry import get_registry
from agent_r1.rollout.loop import RolloutEngine
from agent_r1.testing.models import tiny_model, tiny_tokenizer

AGGREGATION = "token-mean"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps")
    parser.add_argument("--tasks-per-step", type=int, default=4, help="tasks rolled out per step")
    parser.add_argument("--group-size", type=int, default=4, help="samples per task (GRPO's G)")
    parser.add_argument("--lr", type=float, default=3e-2, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the model, the data and sampling")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Train for ``--steps`` steps; print and return one metrics dict per step."""
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    # -- components by name, from the registry (bundled plugins load through entry points) -----
    registry = get_registry()
    registry.register_plugin(toy, "toy", distribution="agent-r1 (testing)")
    dataset = registry.build("datasets", "toy_target", {"num_train": 16})
    env_cls = registry.get("environments", "toy_single_turn")
    shaper = registry.build("reward_shapers", "target_char")
    estimator = registry.build("advantage_estimators", "grpo")
    policy_loss = registry.build("policy_losses", "ppo_clip")

    # -- the policy, its rollout backend and the rollout engine --------------------------------
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=args.seed)
    backend = HFBackend(model=model, tokenizer=tokenizer)
    engine = RolloutEngine(
        backend,
        tokenizer,
        env_factory=lambda: env_cls(),
        max_turns=1,
        max_new_tokens=6,
        max_context=256,
        sampling=SamplingParams(temperature=1.0),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    tasks = dataset.load("train")
    tasks_by_id = {task.id: task for task in tasks}

    history = []
    for step in range(args.steps):
        # 1. roll out with the current weights (the backend shares the model object)
        start = step * args.tasks_per_step
        step_tasks = [tasks[(start + i) % len(tasks)] for i in range(args.tasks_per_step)]
        model.eval()
        with torch.no_grad():
            trajectories = engine.collect(
                step_tasks,
                args.group_size,
                seed=args.seed * 1000 + step,
                policy_version=step,
                group_salt=str(step),
            )
        # 2. rewards: signals go on the trajectory; the engine places them on the tokens
        for trajectory in trajectories:
            trajectory.rewards.extend(shaper.score(trajectory, tasks_by_id[trajectory.task_id]))
        # 3. tensors
        batch = collate(trajectories, pad_token_id=tokenizer.pad_token_id)
        mask = batch.loss_mask  # [B, T] bool: policy-sampled tokens only
        # 4. advantages, per-token loss, aggregation
        advantages, _returns = estimator.compute(
            AdvantageInput(
                token_rewards=batch.token_rewards,  # [B, T]
                loss_mask=mask,
                scores=batch.scores,  # [B]
                group_ids=batch.group_ids,
            )
        )
        model.train()
        logprobs = policy_forward(model, batch.input_ids, batch.attention_mask).logprobs  # [B, T]
        token_loss, diagnostics = policy_loss.token_loss(
            LossInput(
                logprobs=logprobs,
                old_logprobs=batch.rollout_logprobs,  # on-policy: the sampler's log-probs
                advantages=advantages,
                loss_mask=mask,
            )
        )
        normalizer = Normalizer.from_masks(mask, AGGREGATION)  # once per optimizer step
        loss = aggregate(token_loss, mask, AGGREGATION, normalizer=normalizer)
        # 5. update and sync
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        backend.sync_weights(model, step + 1)

        gap = (logprobs.detach() - batch.rollout_logprobs).abs()
        metrics = {
            "step": step,
            "reward": float(batch.scores.mean()),
            "loss": float(loss.detach()),
            "clip_fraction": float(masked_mean(diagnostics["clipped"], mask)),
            "policy_tokens": int(mask.sum()),
            "logprob_gap": float(gap[mask].max()),
        }
        if not all(math.isfinite(float(value)) for value in metrics.values()):
            raise RuntimeError(f"non-finite metrics at step {step}: {metrics}")
        print(json.dumps(metrics), flush=True)
        history.append(metrics)
    return history


if __name__ == "__main__":
    main()
