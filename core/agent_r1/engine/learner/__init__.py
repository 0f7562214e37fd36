"""The learner's pieces, used by :mod:`agent_r1.engine.update`: padding and forward passes
(:mod:`~agent_r1.engine.learner.batch`), masked statistics, group statistics and loss aggregation
(:mod:`~agent_r1.engine.learner.loss_utils`), the critic (:mod:`~agent_r1.engine.learner.critic`),
rollout correction (:mod:`~agent_r1.engine.learner.rollout_correction`) and turn ids and anchor keys
(:mod:`~agent_r1.engine.learner.turns`)."""
