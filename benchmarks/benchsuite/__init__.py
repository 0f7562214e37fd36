"""``make bench``: how fast agent-r1 turns compute into a trained agent, side by side with TRL.

One command, three sections (``--only`` picks some) and an overhead table, one report
(``bench.json``, ``bench.md`` and ``bench_*.png`` in ``--out``):

* ``trl``: agent-r1 and TRL's ``GRPOTrainer`` (``benchmarks/bench_trl.py``, run with the
  interpreter of ``--trl-python``) train the same model on the same prompts, in the same order,
  with the same group size, token budgets, learning rate, optimizer, clipping and loss
  normalisation (GRPO with group-std scaling, token-mean loss, beta = 0), alternating the two arms
  (A B B A ...) so that machine noise hits both. Every arm runs in a subprocess of its own, so that
  its peak memory (RSS high-water mark) is its own. Two tasks: single-turn GRPO on arithmetic
  prompts, and a multi-turn tool task (look up two codes with an ``async`` tool, then stop) run by
  TRL's ``environment_factory`` and by agent-r1's engine over the very same environment class
  (:class:`CodeBook`, through :class:`agent_r1.integrations.trl.TRLEnvironment`).
* ``tools``: the engine's tool concurrency: a real :class:`~agent_r1.Tool` that sleeps 200 ms,
  64 trajectories, 3 turns, a scripted policy that always calls it; the tool wall time of the
  rollout against one call per turn.
* ``scaling``: step time against tasks per step, group size, number of turns and context length,
  with the step's time split into generation, tool waiting, training passes and the rest.
* the agent-r1 runs of ``trl`` and ``scaling`` also give the share of step time that is neither
  model compute nor tool waiting (the overhead table).

Run from the repository root (``make bench`` builds both environments first)::

    .venv/bin/python benchmarks/bench.py                      # everything (about 20 min, 2 idle cores)
    .venv/bin/python benchmarks/bench.py --only tools,scaling # no TRL environment needed
    .venv/bin/python benchmarks/bench.py --smoke --out runs/bench-smoke   # seconds: checks it runs

``--update`` merges what a run measured into an existing report (a ``trl`` case by name, a
``scaling`` model, the ``tools`` section), ``--from-json`` only rewrites the report and plots.
``bench.py arm SPEC.json OUT.json`` runs one agent-r1 arm (what the ``trl`` section starts in a
subprocess). Models, arm outputs and scratch files go to ``--work`` (default ``runs/bench``).

``benchmarks/bench.py`` is the entry script; the code is this package, one module per part, read
in this order: :mod:`.tasks`, :mod:`.rewards`, :mod:`.codebook` (the tool task, in TRL's
``environment_factory`` contract), :mod:`.environments` and :mod:`.lookup_tools` (agent-r1
components, given to the run configs by Python path), :mod:`.models`, :mod:`.arm` (one agent-r1
arm), the sections :mod:`.trl_section`, :mod:`.tools_section` and :mod:`.scaling_section`,
:mod:`.overhead`, :mod:`.stats`, the report (:mod:`.report`, :mod:`.plots`, :mod:`.results`) and
:mod:`.runner` (the command line).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("trl", "tools", "scaling")
DEFAULT_TRL_PYTHON = ".venv-integrations/bin/python"
