"""The run directory: one run per directory (``{now}`` expands to the start time), the config a
resumed run must keep, the files a resumed run rewrites, and the provenance and report it leaves."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent_r1.config import ResolvedComponent, RunConfig
from agent_r1.errors import AgentR1Error

RUN_FILES = (
    "config.json",
    "metrics.jsonl",
    "samples.jsonl",
    "eval_before.json",
    "summary.json",
    "checkpoints",
)
"""What marks a directory as holding a run: a fresh run refuses to start in it."""


def expand_output_dir(output_dir: str, *, resume: bool) -> Path:
    """``{now}`` in ``output_dir`` becomes the start time (``20261121-101500``), so each run gets a
    fresh directory; with ``--resume`` it picks the newest existing directory of that pattern."""
    if "{now}" not in output_dir:
        return Path(output_dir)
    if resume:
        pattern = Path(output_dir.replace("{now}", "*"))
        existing = sorted(pattern.parent.glob(pattern.name))
        if existing:
            return existing[-1]
    return Path(output_dir.replace("{now}", time.strftime("%Y%m%d-%H%M%S")))


def check_run_dir(run_dir: Path, plain: dict[str, Any], *, resume: bool, allow_config_change: bool) -> None:
    """One run per directory: a fresh run needs a directory without run files; a resumed run needs
    the same config (or ``--allow-config-change``)."""
    held = [name for name in RUN_FILES if (run_dir / name).exists()]
    if not resume:
        if held:
            raise AgentR1Error(
                f"{run_dir} already holds a run ({', '.join(held)}). Continue it with --resume, or start a "
                "new run with output_dir=<another directory>."
            )
        return
    previous = run_dir / "config.json"
    if not previous.exists():
        return
    earlier = json.loads(previous.read_text(encoding="utf-8"))
    changes = config_changes(earlier, plain)
    if changes and not allow_config_change:
        shown = "\n  ".join(changes[:20])
        raise AgentR1Error(
            f"--resume: the config differs from the one {run_dir} was started with:\n  {shown}\nResume "
            "with the original config, or pass --allow-config-change to continue with the new one (the "
            "change is recorded in config_changes.jsonl)."
        )


def config_changes(before: Any, after: Any, path: str = "") -> list[str]:
    """``path: old -> new`` for every leaf that differs between two plain configs. A section or
    field that the earlier config lacks (it was written by an agent-r1 without it) is no change
    when it holds that field's default now."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[str] = []
        for key in sorted(set(before) | set(after), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in before and _is_default(sub, after[key]):
                continue
            out += config_changes(before.get(key, "<unset>"), after.get(key, "<unset>"), sub)
        return out
    if before != after and not path.startswith("output_dir"):
        return [f"{path}: {json.dumps(before)} -> {json.dumps(after)}"]
    return []


def _is_default(path: str, value: Any) -> bool:
    """Whether ``value`` is the default of the run-config field at dotted ``path`` (sections of
    nested config models only; component options and list items are never assumed default)."""
    model: Any = RunConfig
    *sections, name = path.split(".")
    for section in sections:
        field = model.model_fields.get(section) if isinstance(model, type) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return False
    field = model.model_fields.get(name)
    if field is None or field.is_required():
        return False
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        default = default.model_dump(mode="json")
    return bool(
        json.dumps(default, sort_keys=True, default=str) == json.dumps(value, sort_keys=True, default=str)
    )


def truncate_jsonl(path: Path, key: str, keep_up_to: int) -> None:
    """Drop lines of steps that the resumed run will redo (they came after the checkpoint)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get(key, -1) <= keep_up_to:
                kept.append(line)
        except ValueError:
            continue  # a line cut by a kill: the resumed run writes that step again
    path.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")


def remove_empty_run(run_dir: Path) -> None:
    """A run that failed before its first step leaves nothing behind but its log's lesson."""
    import shutil

    shutil.rmtree(run_dir, ignore_errors=True)


def provenance(components: Sequence[ResolvedComponent]) -> list[dict[str, str]]:
    out = []
    for c in components:
        prov = getattr(c.cls, "provenance", None)
        out.append(
            {
                "path": c.path,
                "kind": c.kind,
                "name": c.name,
                "class": f"{c.cls.__module__}.{c.cls.__qualname__}",
                "plugin": prov.plugin if prov else "",
                "distribution": prov.distribution if prov else "",
                "version": prov.version if prov else "",
            }
        )
    return out


def write_report(run_dir: Path, config: dict[str, Any], summary: dict[str, Any]) -> None:
    from agent_r1.engine.reports.report import load_metrics, plot_curves, write_html_report

    metrics = load_metrics(run_dir / "metrics.jsonl")
    png: Path | None = run_dir / "reward_curve.png"
    try:
        plot_curves(metrics, png)
    except Exception as exc:  # a plotting problem must not lose the run's results: warned, logged
        warnings.warn(f"could not draw {png}: {exc}", stacklevel=2)
        png = None
    write_html_report(run_dir, config, metrics, summary.get("before"), summary.get("after"), png)
