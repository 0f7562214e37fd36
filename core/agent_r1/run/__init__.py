"""A run around the training steps, above the engine: what the commands run.

* :mod:`agent_r1.run.training`: ``train`` and ``demo``: the training loop, evaluation before and
  after, checkpoints and resume, observer hooks, the alarms, the final export;
* :mod:`agent_r1.run.commands`: ``eval`` and ``rollout``, and :func:`~agent_r1.run.commands.prepare`,
  which every command runs first (config, components and preflight checks before a model loads);
* :mod:`agent_r1.run.preflight`: the preflight checks themselves (``agent-r1 check``);
* :mod:`agent_r1.run.rundir`: the run directory (one run per directory, resume rules, provenance);
* :mod:`agent_r1.run.console`: ``run.log``, signals as stop requests, the closing summary.
"""
