"""The agent loop and what it renders, below the engine and the gateway (no torch import).

* :mod:`agent_r1.rollout.loop`: :class:`~agent_r1.rollout.loop.RolloutEngine`, the multi-turn
  agent loop over a rollout backend and an environment, recording token-faithful trajectories;
* :mod:`agent_r1.rollout.chat`: :class:`~agent_r1.rollout.chat.ChatRenderer`, prefix-preserving
  chat rendering of prompts and observations, and the end-of-turn token set;
* :mod:`agent_r1.rollout.templates`: the run's chat template and template variables on a tokenizer;
* :mod:`agent_r1.rollout.decoder`: the turn-decoder protocol (value-guided and best-of-K decoders
  live in :mod:`agent_r1.engine.experimental.decoding`);
* :mod:`agent_r1.rollout.generation`: the shared edges of generation that the engine, the gateway
  and the integrations use (budget-capped generation, group ids, actions from generations,
  per-trajectory metrics, running a coroutine from synchronous code).
"""
