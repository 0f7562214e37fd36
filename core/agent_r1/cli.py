"""The ``agent-r1`` command line.

Built-in commands import their heavy dependencies (torch, transformers) only when they run, and
``agent-r1 --help`` never loads plugins: plugin commands (``register_commands``) are looked up only
when the command line names a subcommand that is not built in.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from agent_r1.errors import AgentR1Error


class _LazyPluginGroup(TyperGroup):
    """A command group that falls back to plugin-provided commands for unknown names."""

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        try:
            return plugin_commands().get(cmd_name)
        except AgentR1Error as exc:  # e.g. AGENT_R1_STRICT_PLUGINS with a broken plugin
            _fail(exc)


def _command_base() -> type:
    """The ``Command`` class of the click that typer runs on (recent typer vendors its own)."""
    for cls in TyperGroup.__mro__:
        if cls.__name__ == "Command":
            return cls
    return object  # pragma: no cover


def plugin_commands() -> dict[str, Any]:
    """Commands contributed by plugins through ``register_commands`` (loads plugins).

    ``typer.Typer`` apps and typer's own commands run as they are; a ``click.Command`` from the
    separate click package runs through a thin bridge that hands it the remaining arguments. A name
    that two plugins provide maps to a command that explains the conflict and exits 2.
    """
    from agent_r1.registry import get_registry

    commands: dict[str, Any] = {}
    for name, providers in get_registry().commands().items():
        if len(providers) > 1:
            who = " and ".join(info.describe() for _, info in providers)
            commands[name] = _passthrough(
                name, None, f"command {name!r} is provided by more than one plugin: {who}"
            )
            continue
        item, _ = providers[0]
        command: Any
        if isinstance(item, typer.Typer):
            command = typer.main.get_command(item)
            command.name = name
        elif isinstance(item, _command_base()):
            command = item
        else:
            command = _passthrough(name, item, None)
        commands[name] = command
    return commands


def _passthrough(name: str, target: Any, conflict: str | None) -> Any:
    """A command that hands every argument (``--help`` included) to ``target.main``, or, when
    ``conflict`` is set, prints it and exits 2."""
    bridge = typer.Typer(add_completion=False)
    doc = (getattr(target, "help", None) or "").strip()
    help_text = conflict or (doc.splitlines()[0] if doc else None)

    @bridge.command(
        name=name,
        help=help_text,
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def run(ctx: typer.Context) -> None:
        if conflict is not None:
            typer.echo(f"error: {conflict}. Disable one with AGENT_R1_DISABLE_PLUGINS=<plugin>.", err=True)
            raise typer.Exit(2)
        target.main(args=list(ctx.args), prog_name=f"agent-r1 {name}", standalone_mode=True)

    command = typer.main.get_command(bridge)
    command.name = name
    return command


app = typer.Typer(
    cls=_LazyPluginGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="End-to-end reinforcement learning for LLM agents that act over many turns with tools.",
    epilog="Plugins may add commands; `agent-r1 plugins list` shows what is installed.",
)
plugins_app = typer.Typer(no_args_is_help=True, help="Inspect installed plugins.")
config_app = typer.Typer(no_args_is_help=True, help="Inspect run configs.")
models_app = typer.Typer(no_args_is_help=True, help="Prepare bundled offline models.")
app.add_typer(plugins_app, name="plugins")
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")

OverridesArg = typer.Argument(None, help="dotlist overrides such as algorithm.name=rloo rollout.max_turns=4")


def _fail(exc: BaseException) -> NoReturn:
    """Print ``error: <message>`` to stderr and exit with status 2."""
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


# --------------------------------------------------------------------------------------------
# plugins
# --------------------------------------------------------------------------------------------


@plugins_app.command("list")
def plugins_list(as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List installed plugins: distribution, version, entry point and components per kind."""
    from agent_r1.registry import PluginLoadWarning, get_registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginLoadWarning)
        try:
            infos = get_registry().plugins()
        except AgentR1Error as exc:  # AGENT_R1_STRICT_PLUGINS with a broken plugin
            _fail(exc)
    if as_json:
        typer.echo(json.dumps([info.as_dict() for info in infos], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="agent-r1 plugins")
    for column in ("plugin", "distribution", "status", "components"):
        table.add_column(column)
    for info in infos:
        components = "\n".join(
            f"{kind}: {', '.join(sorted(names))}" for kind, names in info.components.items() if names
        )
        status = info.status if not info.errors else f"{info.status}\n" + "\n".join(info.errors)
        table.add_row(info.name, f"{info.distribution} {info.version}\n{info.module}", status, components)
    Console().print(table)


@plugins_app.command("doctor")
def plugins_doctor() -> None:
    """Load every plugin and component and explain anything broken. Exit 1 if something is."""
    from agent_r1.registry import get_registry

    infos = get_registry().doctor()
    problems = 0
    for info in infos:
        if info.status == "disabled":
            typer.echo(f"- {info.describe()}: disabled by AGENT_R1_LOAD_PLUGINS/AGENT_R1_DISABLE_PLUGINS")
            continue
        if info.errors:
            problems += 1
            typer.echo(f"✗ {info.describe()}:")
            for error in info.errors:
                typer.echo(f"    {error}")
        else:
            count = sum(len(v) for v in info.components.values())
            typer.echo(f"✓ {info.describe()}: {count} components")
    if problems:
        typer.echo(
            f"{problems} plugin(s) have problems. Fix or uninstall them, or disable them with "
            "AGENT_R1_DISABLE_PLUGINS=<plugin>."
        )
        raise typer.Exit(1)
    typer.echo("all plugins OK")


# --------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------


def _load_checked(config_path: str, overrides: list[str] | None) -> tuple[Any, list[Any]]:
    from agent_r1.config import load_config, validate_components

    config = load_config(config_path, overrides or [])
    return config, validate_components(config)


@config_app.command("show")
def config_show(
    config_path: str = typer.Argument(..., help="run config YAML (or a bundled name such as 'demo')"),
    overrides: list[str] = OverridesArg,
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of YAML"),
) -> None:
    """Print the resolved, validated run config with every component's defaults filled in."""
    import yaml

    from agent_r1.config import resolved_dict

    try:
        config, components = _load_checked(config_path, overrides)
    except AgentR1Error as exc:
        _fail(exc)
    data = resolved_dict(config, components)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


@models_app.command("list")
def models_list() -> None:
    """Bundled model names that work offline."""
    from agent_r1.engine.models import is_prepared, list_bundled_models

    for model in list_bundled_models():
        state = "prepared" if is_prepared(model.name) else "not prepared yet"
        typer.echo(f"{model.name}  ({state})  {model.description}")


@models_app.command("prepare")
def models_prepare(name: str = typer.Argument("smollm2-135m-instruct")) -> None:
    """Convert a bundled model into a local fp32 checkpoint (done once, then cached)."""
    from agent_r1.engine.models import prepare_model

    try:
        path = prepare_model(name, full_check=True)
    except AgentR1Error as exc:
        _fail(exc)
    typer.echo(str(path))


# --------------------------------------------------------------------------------------------
# train / demo / rollout / eval
# --------------------------------------------------------------------------------------------


@app.command()
def train(
    config_path: str = typer.Argument(..., help="run config YAML (or a bundled name such as 'demo')"),
    overrides: list[str] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="continue from the last good checkpoint"),
) -> None:
    """Train a policy as the run config says."""
    from agent_r1.engine.runner import train as run_train

    try:
        run_train(config_path, overrides or [], resume=resume)
    except AgentR1Error as exc:
        _fail(exc)


@app.command()
def demo(
    overrides: list[str] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="continue from the last good checkpoint"),
) -> None:
    """The main job: train SmolLM2-135M-Instruct with GRPO to use a calculator tool."""
    from agent_r1.engine.runner import train as run_train

    try:
        run_train("demo", overrides or [], resume=resume)
    except AgentR1Error as exc:
        _fail(exc)


@app.command()
def rollout(
    config_path: str = typer.Argument(..., help="run config YAML"),
    overrides: list[str] = OverridesArg,
    out: Path = typer.Option(..., "--out", help="trajectories JSONL to write"),
    split: str = typer.Option("train", help="dataset split to draw tasks from"),
    num_tasks: int = typer.Option(8, help="tasks to roll out (each group_size times)"),
) -> None:
    """Collect trajectories with the configured model and environment and save them as JSONL."""
    from agent_r1.engine.runner import collect

    try:
        count = collect(config_path, overrides or [], out=out, split=split, num_tasks=num_tasks)
    except AgentR1Error as exc:
        _fail(exc)
    typer.echo(f"wrote {count} trajectories to {out}")


@app.command("eval")
def evaluate(
    config_path: str = typer.Argument(..., help="run config YAML"),
    overrides: list[str] = OverridesArg,
    checkpoint: Path | None = typer.Option(None, help="checkpoint directory to evaluate"),
    out: Path | None = typer.Option(None, help="directory for eval.json and eval.md"),
) -> None:
    """Evaluate a policy on held-out tasks: success/EM/F1, pass@k, tool use, turns."""
    from agent_r1.engine.runner import evaluate as run_eval

    try:
        report = run_eval(config_path, overrides or [], checkpoint=checkpoint, out=out)
    except AgentR1Error as exc:
        _fail(exc)
    typer.echo(report.get("markdown", json.dumps(report.get("summary", {}), indent=2)))


@app.command()
def view(
    path: Path = typer.Argument(..., help="trajectories JSONL"),
    limit: int = typer.Option(3, help="show at most this many trajectories"),
    tokenizer: str | None = typer.Option(
        None, help="model directory whose tokenizer decodes the tokens, shown coloured by provenance"
    ),
) -> None:
    """Pretty-print trajectories: steps, tool calls and results, rewards, termination, token counts."""
    from agent_r1.engine.viewer import show_trajectories

    if not path.is_file():
        _fail(FileNotFoundError(f"{path} does not exist or is not a file"))
    decoder = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        try:
            decoder = AutoTokenizer.from_pretrained(tokenizer)
        except (OSError, ValueError) as exc:
            _fail(exc)
    try:
        show_trajectories(path, limit=limit, tokenizer=decoder)
    except AgentR1Error as exc:
        _fail(exc)


# --------------------------------------------------------------------------------------------
# new-plugin
# --------------------------------------------------------------------------------------------


@app.command("new-plugin")
def new_plugin(
    name: str = typer.Argument(..., help="plugin name, e.g. 'weather' (letters, digits, _ or -)"),
    directory: Path = typer.Option(
        Path("."), "--dir", help="parent directory; the plugin goes to DIR/agent-r1-plugin-<name>"
    ),
) -> None:
    """Scaffold a plugin distribution: a tool, an environment, a dataset, a reward shaper, tests."""
    from agent_r1.scaffold import plugin_names, render_plugin

    try:
        names = plugin_names(name)
        project = render_plugin(name, directory)
    except AgentR1Error as exc:
        _fail(exc)
    typer.echo(f"created {names.distribution} (plugin {names.name!r}) in {project}")
    typer.echo("next:")
    typer.echo(f"  cd {project}")
    typer.echo('  pip install -e ".[test]"')
    typer.echo("  agent-r1 plugins list && pytest")


def main(argv: list[str] | None = None) -> Any:
    """Console entry point."""
    return app(args=argv if argv is not None else sys.argv[1:], prog_name="agent-r1")


if __name__ == "__main__":  # pragma: no cover
    main()
