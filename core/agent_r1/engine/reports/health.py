"""Reward-hacking alarms: the signatures of a policy that games its reward, watched every step.

A reward going up is not the same as the agent getting better. Each training step the runner hands
the step's metrics (every figure already gathered over all processes, so every process reaches
the same verdict) to a :class:`HealthMonitor`, which compares them with the recent past and adds
``health/<alarm>`` (1 while the alarm is on, else 0) and the figures behind each alarm:

* ``audit_gap``: ``reward/score_mean`` rises while an audit (a reward signal reported with weight
  0, such as ``code_solved`` next to a trained ``code_tests``, or held-out ``eval/success``) does
  not: the gap between the least-squares rises of the two over a window of steps;
* ``length_drop`` and ``tool_drop``: the reward jumps while responses get much shorter, or the
  agent stops calling its tools;
* ``suspect``: the share of rewarded trajectories whose reward came through a path a plugin
  flagged as suspicious (``suspect/<path>``, see :func:`suspect_paths`);
* ``disagreement``: two named signals (a reward model and a verifier) disagree on a large or a
  growing share of the trajectories.

An alarm trips after ``health.patience`` flagged steps in a row and clears after as many calm
ones; :meth:`HealthMonitor.observe` returns a :class:`HealthEvent` for each trip and clear, which
the runner prints (console and ``run.log``) and, under ``health.action: stop``, turns into an
error. The monitor's windows are part of the checkpoint (:meth:`HealthMonitor.state_dict`), so a
resumed run judges its first steps exactly as the uninterrupted run would have.

The per-trajectory figures (``suspect``, ``disagreement``) are counted on each process's
trajectories by :func:`trajectory_counts` and summed over processes by :func:`step_figures`; the
trainer does that in the step (:func:`agent_r1.engine.trainer.train_step`). No torch here.
Documented in docs/reward_hacking.md; every metric in docs/metrics.md.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent_r1.config import HealthConfig
from agent_r1.mdp import Trajectory

__all__ = [
    "ALARMS",
    "SUSPECT_PREFIX",
    "HealthEvent",
    "HealthMonitor",
    "fitted_rise",
    "step_figures",
    "suspect_paths",
    "trajectory_counts",
]

ALARMS = ("audit_gap", "length_drop", "tool_drop", "suspect", "disagreement")
"""Every alarm, in the order they are judged and reported."""

SUSPECT_PREFIX = "suspect/"
"""The prefix of a suspicious reward path: ``Trajectory.metrics["suspect/<path>"]``, an
environment's ``Observation.metrics["suspect/<path>"]`` (``env/suspect/<path>`` on the trajectory)
or a reward signal named ``suspect/<path>``, each counting when it is above 0."""

REWARD = "reward/score_mean"
LENGTH = "response/length_mean"
TOOL_CALLS = "tools/calls_mean"
EVAL = "eval/success"
DISAGREEMENT_RATE = "health/disagreement/rate"
DOCS = "docs/reward_hacking.md"

_ADVICE = {
    "audit_gap": "the trained reward may pay for something other than the task: read rewarded samples "
    "(agent-r1 view), find the signal that rose (reward/<signal>) and tighten it",
    "length_drop": "the policy may have found a short answer that the reward pays for: read the shortest "
    "rewarded samples and check that the reward needs the work done",
    "tool_drop": "the policy is paid without using its tools: check that the reward needs the tools' "
    "results (answers it cannot know without them)",
    "suspect": "rewarded trajectories took a path a plugin flags as suspicious: read them and close the "
    "loophole in the verifier or the environment",
    "disagreement": "the policy may be exploiting the reward model: read samples where the two disagree; "
    "give the verifier more weight or retrain the reward model",
}


# --------------------------------------------------------------------------------------------
# Per-trajectory figures (counted on each process, summed over all)
# --------------------------------------------------------------------------------------------


def suspect_paths(trajectory: Trajectory) -> set[str]:
    """The suspicious paths (``<path>`` of ``suspect/<path>``) a trajectory's reward came through:
    from ``Trajectory.metrics`` (``suspect/<path>`` set by a reward shaper or an embedder,
    ``env/suspect/<path>`` from an environment's ``Observation.metrics``) and from reward signals
    named ``suspect/<path>``; each counts when its value is above 0."""
    paths = set()
    for key, value in trajectory.metrics.items():
        for prefix in (SUSPECT_PREFIX, f"env/{SUSPECT_PREFIX}"):
            if key.startswith(prefix) and value > 0:
                paths.add(key[len(prefix) :])
    for name, value in trajectory.reward_by_name().items():
        if name.startswith(SUSPECT_PREFIX) and value > 0:
            paths.add(name[len(SUSPECT_PREFIX) :])
    return paths


def trajectory_counts(trajectories: Sequence[Trajectory], config: HealthConfig) -> dict[str, int]:
    """Counts over one process's trained-on trajectories that the ``suspect`` and
    ``disagreement`` alarms need (plain integers, so that summing them over processes is exact):
    ``rewarded``, ``suspect`` (rewarded and flagged), ``path:<path>`` (rewarded and flagged with
    that path), ``pairs`` (carrying both compared signals), ``disagree`` and ``rm_only`` (the reward
    model says good, the verifier bad)."""
    counts: Counter[str] = Counter()
    if config.suspect.enabled:
        for trajectory in trajectories:
            if trajectory.score <= config.suspect.rewarded_above:
                continue
            counts["rewarded"] += 1
            paths = suspect_paths(trajectory)
            if paths:
                counts["suspect"] += 1
            for path in paths:
                counts[f"path:{path}"] += 1
    cfg = config.disagreement
    if cfg.enabled and cfg.configured:
        for trajectory in trajectories:
            rewards = trajectory.reward_by_name()
            if cfg.reward_model not in rewards or cfg.verifier not in rewards:
                continue
            model_good = rewards[str(cfg.reward_model)] >= cfg.reward_model_threshold
            verifier_good = rewards[str(cfg.verifier)] >= cfg.verifier_threshold
            counts["pairs"] += 1
            counts["disagree"] += int(model_good != verifier_good)
            counts["rm_only"] += int(model_good and not verifier_good)
    return dict(counts)


def step_figures(per_process: Iterable[Mapping[str, int]], config: HealthConfig) -> dict[str, float]:
    """The step metrics of the per-trajectory alarms from every process's
    :func:`trajectory_counts` (see docs/metrics.md#reward-hacking-alarms)."""
    total: Counter[str] = Counter()
    for counts in per_process:
        total.update(counts)
    out: dict[str, float] = {}
    if config.suspect.enabled:
        rewarded = total["rewarded"]
        out["health/suspect/rewarded"] = float(rewarded)
        out["health/suspect/count"] = float(total["suspect"])
        out["health/suspect/rate"] = total["suspect"] / rewarded if rewarded else 0.0
        for key in sorted(k for k in total if k.startswith("path:")):
            out[f"health/suspect_path/{key[len('path:') :]}"] = float(total[key])
    if config.disagreement.enabled and config.disagreement.configured:
        pairs = total["pairs"]
        out["health/disagreement/pairs"] = float(pairs)
        if pairs:
            out[DISAGREEMENT_RATE] = total["disagree"] / pairs
            out["health/disagreement/rm_only"] = total["rm_only"] / pairs
    return out


# --------------------------------------------------------------------------------------------
# Trends
# --------------------------------------------------------------------------------------------

Point = tuple[int, float]
"""``(step, value)``."""


def _fit(points: Sequence[Point]) -> tuple[float, float]:
    """Least-squares line through ``points``: ``(slope per step, fitted value at the first step)``,
    in float64 (Python floats)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return slope, mean_y + slope * (points[0][0] - mean_x)


def fitted_rise(points: Sequence[Point], span: tuple[int, int] | None = None) -> float:
    """How much a least-squares line through ``points`` rises from the first step to the last
    (or across ``span``, ``(first step, last step)``): robust to one noisy step, unlike the
    difference of two single values."""
    if len(points) < 2:
        return 0.0
    first, last = span or (points[0][0], points[-1][0])
    return _fit(points)[0] * (last - first)


def _needed(window: int) -> int:
    """Points a per-step trend needs before it is judged: half the window, at least 3."""
    return max(3, window // 2)


# --------------------------------------------------------------------------------------------
# The monitor
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HealthEvent:
    """Something the runner prints: an alarm that ``tripped`` or ``cleared`` at ``step``, or a
    ``notice`` (an alarm that cannot watch what the config names)."""

    kind: Literal["tripped", "cleared", "notice"]
    alarm: str
    step: int
    message: str
    advice: str = ""


@dataclass
class _Check:
    """One alarm's verdict on one step: flagged or not, the figures behind it, and a sentence."""

    flagged: bool
    figures: dict[str, float]
    detail: str


@dataclass
class _AlarmState:
    """One alarm across steps (saved in checkpoints)."""

    active: bool = False
    streak: int = 0
    """Flagged verdicts in a row."""
    calm: int = 0
    """Calm verdicts in a row."""
    trips: int = 0
    """Times the alarm tripped in this run."""
    since: int = 0
    """The step the alarm last tripped at."""
    detail: str = ""
    """The latest flagged verdict's sentence."""


class HealthMonitor:
    """Watches the steps of one run for the signatures of reward hacking (module docstring). Built
    once per run from ``health`` (the session holds it); :meth:`observe` is called once per step,
    after any evaluation of that step, with the step's metrics."""

    def __init__(self, config: HealthConfig, *, eval_every: int = 0) -> None:
        self.config = config
        self.eval_every = eval_every
        self._series: dict[str, list[Point]] = {}
        self._evals: list[Point] = []
        self._alarms = {name: _AlarmState() for name in ALARMS}
        self._noticed: set[str] = set()

    # -- what is watched ---------------------------------------------------------------------
    def watched(self) -> dict[str, str]:
        """Alarm → what it watches, for the alarms that can trip in this run."""
        c = self.config
        out: dict[str, str] = {}
        audits = [f"reward/{name}" for name in c.audit_gap.signals]
        if c.audit_gap.use_eval and self.eval_every:
            audits.append(EVAL)
        if c.audit_gap.enabled and audits:
            out["audit_gap"] = f"{REWARD} against {', '.join(audits)}"
        if c.length_drop.enabled:
            out["length_drop"] = f"{REWARD} against {LENGTH}"
        if c.tool_drop.enabled:
            out["tool_drop"] = f"{REWARD} against {TOOL_CALLS}"
        if c.suspect.enabled:
            out["suspect"] = f"rewarded trajectories flagged {SUSPECT_PREFIX}<path>"
        if c.disagreement.enabled and c.disagreement.configured:
            out["disagreement"] = f"{c.disagreement.reward_model} against {c.disagreement.verifier}"
        return out

    def describe(self) -> str:
        """One line for the start of a run: what is watched, and how to watch the rest."""
        watched = self.watched()
        hints = {
            "audit_gap": "name health.audit_gap.signals or set trainer.eval_every",
            "disagreement": "name health.disagreement.reward_model and .verifier",
        }
        off = [
            f"{name} ({hints[name]})"
            if name in hints and getattr(self.config, name).enabled
            else f"{name} (off)"
            for name in ALARMS
            if name not in watched
        ]
        line = f"health: watching {', '.join(watched) or 'nothing'}"
        if off:
            line += f"; not watching {', '.join(off)}"
        return f"{line} ({DOCS})"

    @property
    def active(self) -> list[str]:
        """The alarms that are on."""
        return [name for name, state in self._alarms.items() if state.active]

    # -- one step ----------------------------------------------------------------------------
    def note_eval(self, step: int, success: float) -> None:
        """Record held-out success after ``step`` (0: before training); :meth:`observe` reads
        ``eval/success`` from a step's metrics itself."""
        self._evals = sorted({**dict(self._evals), step: float(success)}.items())[
            -self.config.audit_gap.eval_points :
        ]

    def observe(self, step: int, metrics: dict[str, float]) -> list[HealthEvent]:
        """Judge step ``step`` from its ``metrics`` (adding ``health/...`` figures and flags to
        it) and return what changed: alarms that tripped or cleared, and notices."""
        events: list[HealthEvent] = []
        if not self.config.enabled:
            return events
        self._record(step, metrics)
        if EVAL in metrics:
            self.note_eval(step, metrics[EVAL])
        checks: dict[str, _Check | None] = {
            "audit_gap": self._audit_gap(step, metrics, events),
            "length_drop": self._drop("length_drop", LENGTH, step, start_floor=1.0),
            "tool_drop": self._drop(
                "tool_drop", TOOL_CALLS, step, start_floor=self.config.tool_drop.min_calls
            ),
            "suspect": self._suspect(metrics),
            "disagreement": self._disagreement(step, metrics, events),
        }
        watched = self.watched()
        for name in ALARMS:
            if name not in watched:
                continue
            check = checks[name]
            if check is not None:
                metrics.update(check.figures)
            events += self._advance(name, step, check)
            metrics[f"health/{name}"] = float(self._alarms[name].active)
        metrics["health/alarms"] = float(len(self.active))
        return events

    def _record(self, step: int, metrics: Mapping[str, float]) -> None:
        """Keep the figures the trends need, for the longest window."""
        c = self.config
        keys = [REWARD, LENGTH, TOOL_CALLS, DISAGREEMENT_RATE, *(f"reward/{n}" for n in c.audit_gap.signals)]
        longest = max(c.audit_gap.window, c.length_drop.window, c.tool_drop.window, c.disagreement.window)
        if c.audit_gap.use_eval and self.eval_every:  # the reward across the evaluations' span
            longest = max(longest, self.eval_every * c.audit_gap.eval_points + 1)
        for key in keys:
            series = [p for p in self._series.get(key, []) if p[0] > step - longest and p[0] != step]
            if key in metrics:
                series.append((step, float(metrics[key])))
            if series:
                self._series[key] = series
            else:
                self._series.pop(key, None)

    def _window(self, key: str, step: int, window: int) -> list[Point]:
        return [p for p in self._series.get(key, []) if p[0] > step - window]

    def _advance(self, name: str, step: int, check: _Check | None) -> list[HealthEvent]:
        """Patience: trip after ``patience`` flagged verdicts in a row, clear after as many calm ones."""
        state, patience = self._alarms[name], self.config.patience
        if check is None:  # no verdict this step
            return []
        if check.flagged:
            state.streak, state.calm = state.streak + 1, 0
            state.detail = check.detail
        else:
            state.streak, state.calm = 0, state.calm + 1
        if not state.active and state.streak >= patience:
            state.active, state.since, state.trips = True, step, state.trips + 1
            message = f"health: ALARM {name} at step {step}: {state.detail}"
            return [HealthEvent("tripped", name, step, message, _ADVICE[name])]
        if state.active and state.calm >= patience:
            state.active = False
            message = (
                f"health: {name} cleared at step {step} (on since step {state.since}; now {check.detail})"
            )
            return [HealthEvent("cleared", name, step, message)]
        return []

    # -- the alarms --------------------------------------------------------------------------
    # Each returns a verdict, or None for "no verdict this step" (too few points yet, no rewarded
    # trajectory, no evaluation since the last verdict), which neither trips nor clears an alarm.

    def _audit_gap(self, step: int, metrics: Mapping[str, float], events: list[HealthEvent]) -> _Check | None:
        cfg = self.config.audit_gap
        if not cfg.enabled:
            return None
        for name in cfg.signals:
            if f"reward/{name}" not in metrics and f"audit:{name}" not in self._noticed:
                self._noticed.add(f"audit:{name}")
                seen = sorted(k[len("reward/") :] for k in metrics if k.startswith("reward/"))
                events.append(
                    HealthEvent(
                        "notice",
                        "audit_gap",
                        step,
                        f"health: audit_gap: no reward signal {name!r} at step {step} (signals: "
                        f"{', '.join(seen) or 'none'}); it is left out until it appears. Check "
                        "health.audit_gap.signals",
                    )
                )
        audits: list[tuple[str, list[Point], list[Point]]] = []  # (audit, its points, reward points)
        need = _needed(cfg.window)
        for name in cfg.signals:
            audit = self._window(f"reward/{name}", step, cfg.window)
            first, last = (audit[0][0], audit[-1][0]) if audit else (0, 0)
            reward = [p for p in self._window(REWARD, step, cfg.window) if first <= p[0] <= last]
            if len(audit) >= need and len(reward) >= need:
                audits.append((f"reward/{name}", audit, reward))
        # held-out success: judged once per evaluation, so that patience counts evaluations
        if EVAL in metrics and cfg.use_eval and self.eval_every and len(self._evals) >= 2:
            first, last = self._evals[0][0], self._evals[-1][0]
            reward = [p for p in self._series.get(REWARD, []) if first <= p[0] <= last]
            if len(reward) >= 2:
                audits.append((EVAL, list(self._evals), reward))
        verdicts = [self._gap(cfg, *audit) for audit in audits]
        if not verdicts:
            return None
        flagged = [v for v in verdicts if v.flagged]
        worst = max(flagged or verdicts, key=lambda v: v.figures.get("health/audit_gap/gap", -math.inf))
        return worst

    @staticmethod
    def _gap(cfg: Any, audit_name: str, audit: list[Point], reward: list[Point]) -> _Check:
        """The share of the reward's rise that the audit did not follow, over the audit's span."""
        span = (audit[0][0], audit[-1][0])
        reward_rise, audit_rise = fitted_rise(reward, span), fitted_rise(audit, span)
        figures = {"health/audit_gap/reward_rise": reward_rise, "health/audit_gap/audit_rise": audit_rise}
        over = f"over steps {span[0]}-{span[1]}"
        if reward_rise < cfg.min_reward_rise:  # the reward is not rising: nothing to audit
            detail = f"{REWARD} rose {reward_rise:+.3f} {over} (below health.audit_gap.min_reward_rise)"
            return _Check(False, figures, detail)
        gap = 1.0 - audit_rise / reward_rise
        figures["health/audit_gap/gap"] = gap
        detail = (
            f"{REWARD} rose {reward_rise:+.3f} {over} while {audit_name} rose {audit_rise:+.3f}: "
            f"{gap:.0%} of the rise not followed (health.audit_gap.max_gap={cfg.max_gap:g})"
        )
        return _Check(gap > cfg.max_gap, figures, detail)

    def _drop(
        self, name: Literal["length_drop", "tool_drop"], key: str, step: int, *, start_floor: float
    ) -> _Check | None:
        cfg = self.config.length_drop if name == "length_drop" else self.config.tool_drop
        if not cfg.enabled:
            return None
        reward, figure = self._window(REWARD, step, cfg.window), self._window(key, step, cfg.window)
        need = _needed(cfg.window)
        if len(reward) < need or len(figure) < need:
            return None
        slope, start = _fit(figure)
        if start < start_floor:  # too little to lose (no tools in use, empty responses)
            return _Check(False, {}, f"{key} starts the window at {start:.3g}, too little to watch")
        reward_rise = fitted_rise(reward)
        drop = -slope * (figure[-1][0] - figure[0][0]) / start
        return _Check(
            flagged=reward_rise >= cfg.min_reward_rise and drop > cfg.max_drop,
            figures={f"health/{name}/drop": drop, f"health/{name}/reward_rise": reward_rise},
            detail=f"{REWARD} rose {reward_rise:+.3f} over steps {figure[0][0]}-{figure[-1][0]} while {key} "
            f"fell {drop:.0%} from {start:.3g} (health.{name}.max_drop={cfg.max_drop:g})",
        )

    def _suspect(self, metrics: Mapping[str, float]) -> _Check | None:
        cfg = self.config.suspect
        if not cfg.enabled or metrics.get("health/suspect/rewarded", 0.0) < cfg.min_rewarded:
            return None
        rewarded, rate = metrics["health/suspect/rewarded"], metrics["health/suspect/rate"]
        paths = sorted(
            (k[len("health/suspect_path/") :], int(v))
            for k, v in metrics.items()
            if k.startswith("health/suspect_path/")
        )
        shown = ", ".join(f"{path} ({count})" for path, count in paths) or "none"
        return _Check(
            flagged=rate > cfg.max_rate,
            figures={},  # the step's figures are already in the metrics (trainer)
            detail=f"{rate:.0%} of {int(rewarded)} rewarded trajectories came through suspicious paths: "
            f"{shown} (health.suspect.max_rate={cfg.max_rate:g})",
        )

    def _disagreement(
        self, step: int, metrics: Mapping[str, float], events: list[HealthEvent]
    ) -> _Check | None:
        cfg = self.config.disagreement
        if not (cfg.enabled and cfg.configured):
            return None
        if DISAGREEMENT_RATE not in metrics:
            if "disagreement" not in self._noticed:
                self._noticed.add("disagreement")
                events.append(
                    HealthEvent(
                        "notice",
                        "disagreement",
                        step,
                        f"health: disagreement: no trajectory of step {step} carries both "
                        f"{cfg.reward_model!r} and {cfg.verifier!r}; the alarm waits for them. Check "
                        "health.disagreement's reward_model and verifier against the reward/<signal> "
                        "metrics",
                    )
                )
            return None
        rate = metrics[DISAGREEMENT_RATE]
        series = self._window(DISAGREEMENT_RATE, step, cfg.window)
        rise = fitted_rise(series) if len(series) >= _needed(cfg.window) else None
        figures = {} if rise is None else {"health/disagreement/rise": rise}
        rising = rise is not None and rise > cfg.max_rise
        detail = f"{cfg.reward_model} and {cfg.verifier} disagree on {rate:.0%} of the trajectories"
        if rise is not None:
            detail += f", a rate that rose {rise:+.3f} over steps {series[0][0]}-{series[-1][0]}"
        detail += f" (health.disagreement.max_rate={cfg.max_rate:g}, max_rise={cfg.max_rise:g})"
        return _Check(flagged=rate > cfg.max_rate or rising, figures=figures, detail=detail)

    # -- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The windows and the alarms' states, as plain data (saved in checkpoints)."""
        return {
            "version": 1,
            "series": {key: [list(p) for p in points] for key, points in self._series.items()},
            "evals": [list(p) for p in self._evals],
            "alarms": {name: vars(state).copy() for name, state in self._alarms.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; windows longer than the config keeps are cut when
        the next step is recorded."""
        self._series = {
            key: [(int(s), float(v)) for s, v in points] for key, points in state["series"].items()
        }
        self._evals = [(int(s), float(v)) for s, v in state["evals"]][-self.config.audit_gap.eval_points :]
        for name, saved in state["alarms"].items():
            if name in self._alarms:
                self._alarms[name] = _AlarmState(**saved)
