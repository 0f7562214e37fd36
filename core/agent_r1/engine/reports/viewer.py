"""Pretty-print trajectories from a JSONL file (``agent-r1 view runs/demo/trajectories.jsonl``).

For each trajectory: its ids, policy version, termination and score; the tokens per provenance
(prompt, policy, environment, template) and per turn; every step's action text, tool calls, tool
results and rewards; and the reward signals. The trajectory file holds token ids, not text, so
without a tokenizer the tokens themselves are summarised by counts. Pass a tokenizer to
:func:`show_trajectories` to also see the decoded token stream coloured by provenance.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from agent_r1.errors import TrajectoryError
from agent_r1.mdp import Step, TokenSource, Trajectory, iter_trajectories

SOURCE_STYLES: dict[TokenSource, str] = {
    TokenSource.PROMPT: "dim",
    TokenSource.POLICY: "bold green",
    TokenSource.ENV: "cyan",
    TokenSource.TEMPLATE: "magenta",
}
"""How each token provenance is coloured."""

MAX_TEXT = 2000
"""Longer action texts and tool results are cut to this many characters."""


def _cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[:limit] + f" … [{len(text) - limit} more characters]"


def token_counts(trajectory: Trajectory) -> dict[str, int]:
    """Number of tokens per provenance (``prompt``, ``policy``, ``env``, ``template``)."""
    counts: Counter[str] = Counter()
    for segment in trajectory.segments:
        counts[segment.source.value] += len(segment.token_ids)
    return {source.value: counts.get(source.value, 0) for source in TokenSource}


def _summary(trajectory: Trajectory) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "task", f"{trajectory.task_id} (group {trajectory.group_id or '-'}, sample {trajectory.sample_index})"
    )
    termination = trajectory.termination or "-"
    if trajectory.truncated:
        termination += " (truncated)"
    table.add_row("termination", termination)
    table.add_row("policy version", str(trajectory.policy_version))
    if trajectory.turn_versions:  # asynchronous rollouts: the weights of each action turn
        versions = ", ".join(f"turn {t}: {v}" for t, v in sorted(trajectory.turn_versions.items()))
        table.add_row("turn versions", versions)
    table.add_row("score", f"{trajectory.score:.4g}")
    counts = token_counts(trajectory)
    table.add_row(
        "tokens",
        Text.assemble(
            f"{len(trajectory)} = ",
            *[
                part
                for source in TokenSource
                for part in ((f"{counts[source.value]} {source.value}", SOURCE_STYLES[source]), " + ")
            ][:-1],
        ),
    )
    per_turn: dict[int, Counter[str]] = {}
    for segment in trajectory.segments:
        per_turn.setdefault(segment.turn, Counter())[segment.source.value] += len(segment.token_ids)
    table.add_row(
        "per turn",
        "; ".join(
            f"turn {turn}: " + ", ".join(f"{n} {source}" for source, n in counts_of_turn.items())
            for turn, counts_of_turn in sorted(per_turn.items())
        )
        or "-",
    )
    if trajectory.metrics:
        table.add_row("metrics", ", ".join(f"{k}={v:.4g}" for k, v in sorted(trajectory.metrics.items())))
    return table


def _step(step: Step) -> RenderableType:
    action = step.action
    parts: list[RenderableType] = []
    header = Text(f"turn {step.turn}", style="bold")
    header.append(f"  finish: {action.finish_reason}", style="dim")
    header.append(f"  policy tokens: {len(action.token_ids)}", style="dim")
    if step.generation_s or step.tool_s:
        header.append(f"  generation {step.generation_s:.2f} s, tools {step.tool_s:.2f} s", style="dim")
    parts.append(header)
    parts.append(Text(_cut(action.text) or "(empty action)", style=SOURCE_STYLES[TokenSource.POLICY]))
    for call in action.tool_calls:
        parts.append(Text(f"→ call {call.name}({call.arguments}) [{call.id}]", style="yellow"))
    if action.answer is not None:
        parts.append(Text(f"→ answer: {action.answer}", style="bold yellow"))
    for error in action.parse_errors:
        parts.append(Text(f"→ parse error: {error}", style="red"))
    observation = step.observation
    if observation is not None:
        for result in observation.tool_results:
            status = "ok" if result.ok else f"failed ({result.error})"
            extra = f", {result.duration_s:.2f} s" if result.duration_s else ""
            extra += ", truncated" if result.truncated else ""
            style = SOURCE_STYLES[TokenSource.ENV] if result.ok else "red"
            parts.append(Text(f"← {result.name} {status}{extra}: {_cut(result.content)}", style=style))
        for signal in observation.rewards:
            parts.append(Text(f"reward {signal.name} = {signal.value:.4g} ({signal.kind})", style="blue"))
        if observation.done:
            parts.append(Text(f"episode ends: {observation.termination or 'done'}", style="bold"))
    return Group(*parts)


def _rewards(trajectory: Trajectory) -> Table | Text:
    if not trajectory.rewards:
        return Text("no reward signals", style="dim")
    table = Table(
        "signal", "kind", "turn", "value", "weight", "source", title="rewards", title_justify="left"
    )
    for signal in trajectory.rewards:
        table.add_row(
            signal.name,
            signal.kind,
            "-" if signal.turn is None else str(signal.turn),
            f"{signal.value:.4g}",
            f"{signal.weight:.4g}",
            signal.source or "-",
        )
    return table


def _tokens(trajectory: Trajectory, tokenizer: Any) -> Text:
    text = Text()
    for segment in trajectory.segments:
        text.append(tokenizer.decode(segment.token_ids), style=SOURCE_STYLES[segment.source])
    return text


def render_trajectory(trajectory: Trajectory, *, tokenizer: Any = None) -> Panel:
    """A rich panel for one trajectory (see the module docstring)."""
    parts: list[RenderableType] = [_summary(trajectory)]
    if tokenizer is not None:
        parts.append(_tokens(trajectory, tokenizer))
    parts.extend(_step(step) for step in trajectory.steps)
    if not trajectory.steps:
        parts.append(Text("no steps recorded", style="dim"))
    parts.append(_rewards(trajectory))
    return Panel(Group(*parts), title=f"trajectory {trajectory.id}", title_align="left")


def _not_trajectories(path: Path, why: str) -> TrajectoryError:
    return TrajectoryError(
        f"{path} is not a trajectory file: {why}. `agent-r1 view` reads the JSONL files of trajectories "
        "that agent-r1 writes: <run>/samples.jsonl, <run>/eval_before.jsonl, <run>/eval_after.jsonl, "
        "or the --out file of `agent-r1 rollout`."
    )


def check_trajectory_file(path: str | Path) -> None:
    """Raise :class:`~agent_r1.TrajectoryError` saying so when ``path`` is clearly not a file of
    trajectories: binary data, text that is not JSON, or JSON whose first record is not a
    trajectory. A real trajectory file with one bad line later is left to the reader, which names
    that line."""
    from pydantic import ValidationError

    path = Path(path)
    with path.open("rb") as handle:
        first = b""
        for raw in handle:
            if raw.strip():
                first = raw
                break
    if not first:
        return
    try:
        line = first.decode("utf-8")
    except UnicodeDecodeError:
        raise _not_trajectories(path, "it holds binary data, not JSON lines") from None
    try:
        Trajectory.from_json_line(line)
    except TrajectoryError:
        raise  # a newer schema: its own message says to upgrade
    except ValidationError as exc:
        errors = exc.errors()
        fields = ", ".join(".".join(str(p) for p in error["loc"]) or "<root>" for error in errors[:4])
        more = f" and {len(errors) - 4} more" if len(errors) > 4 else ""
        raise _not_trajectories(
            path, f"its first record has unexpected or missing fields ({fields}{more})"
        ) from None
    except ValueError as exc:
        raise _not_trajectories(path, f"its first line is not a JSON trajectory ({exc})") from None


def show_trajectories(
    path: str | Path, limit: int = 3, *, console: Console | None = None, tokenizer: Any = None
) -> int:
    """Print the first ``limit`` trajectories of a JSONL file; returns how many were shown.

    A corrupt line raises :class:`~agent_r1.TrajectoryError` naming the file and line. With a
    ``tokenizer`` (anything with ``decode(list[int]) -> str``) the token stream is shown too,
    coloured by provenance.
    """
    check_trajectory_file(path)
    console = console or Console()
    legend = Text("tokens: ")
    for source in TokenSource:
        legend.append(source.value, style=SOURCE_STYLES[source])
        legend.append(" ")
    shown = 0
    for trajectory in iter_trajectories(path):
        if shown >= limit:
            break
        if shown == 0:
            console.print(legend)
        console.print(render_trajectory(trajectory, tokenizer=tokenizer))
        shown += 1
    if shown == 0:
        console.print(f"{path}: no trajectories")
    return shown
