"""``make bench``: how fast agent-r1 turns compute into a trained agent, side by side with TRL.

The entry script of the benchmark; its code is the package ``benchsuite`` beside this file (the
sections, the options and the report are described in ``benchsuite/__init__.py``)::

    .venv/bin/python benchmarks/bench.py --trl-python .venv-integrations/bin/python   # make bench
    .venv/bin/python benchmarks/bench.py --only tools,scaling        # no TRL environment needed
    .venv/bin/python benchmarks/bench.py --smoke --out runs/bench-smoke   # seconds: checks it runs
    .venv/bin/python benchmarks/bench.py arm SPEC.json OUT.json      # one agent-r1 arm (a subprocess)

``import bench`` (with ``benchmarks/`` on ``sys.path``) gives the names the TRL arm
(``bench_trl.py``) and the tests use: the tasks, the reward, the tool task and the memory figures.
"""

from __future__ import annotations

from benchsuite.arm import library_versions, peak_rss_mib
from benchsuite.arm import rss_mib as _rss_mib
from benchsuite.codebook import CALLS, CodeBook, interval_union
from benchsuite.results import jsonable as _jsonable
from benchsuite.rewards import text_reward
from benchsuite.runner import main
from benchsuite.tasks import ONE_SHOT, code_of, make_tasks

__all__ = [
    "CALLS",
    "ONE_SHOT",
    "CodeBook",
    "_jsonable",
    "_rss_mib",
    "code_of",
    "interval_union",
    "library_versions",
    "main",
    "make_tasks",
    "peak_rss_mib",
    "text_reward",
]

if __name__ == "__main__":
    raise SystemExit(main())
