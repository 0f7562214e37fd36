"""The ``agent-r1`` command line.

Built-in commands import their heavy dependencies (torch, transformers) only when they run, and
``agent-r1 --help`` never loads plugins: plugin commands (``register_commands``) are looked up only
when the command line names a subcommand that is not built in.

Errors: a failure the user can fix (an :class:`~agent_r1.errors.AgentR1Error`) prints
``error: <message>`` and exits 2; anything else is a bug and prints ``error: internal error:
<type>: <message>`` and exits 1. Neither prints a traceback unless ``AGENT_R1_DEBUG=1`` is set.
Every built-in command is wrapped in :func:`reports_errors`, the one place that turns an
:class:`~agent_r1.errors.AgentR1Error` into that message; :func:`main` does the same for what is
raised outside a command (plugin commands) and reports the rest as internal errors.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

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


DEBUG_ENV = "AGENT_R1_DEBUG"
"""Set it to 1 to see the traceback of an error."""


def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _print_error(text: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def _report_error(exc: AgentR1Error) -> int:
    """Print an error agent-r1 raised on purpose as ``error: <message>`` to stderr (the traceback
    first under ``AGENT_R1_DEBUG=1``); returns the exit status: 2, or a
    :class:`~agent_r1.errors.RunInterrupted`'s own, whose message is printed as it is."""
    if _debug():
        import traceback

        traceback.print_exception(exc)
    from agent_r1.errors import RunInterrupted

    if isinstance(exc, RunInterrupted):  # not an error: say what happened and how to go on
        print(str(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    _print_error(str(exc))
    return 2


def _fail(exc: AgentR1Error) -> NoReturn:
    """Report ``exc`` (see :func:`_report_error`) and exit with its status."""
    raise typer.Exit(_report_error(exc))


_Result = TypeVar("_Result")


def reports_errors(command: Callable[..., _Result]) -> Callable[..., _Result]:
    """Run ``command`` so that an :class:`~agent_r1.errors.AgentR1Error` it raises prints
    ``error: <message>`` and exits 2 (:func:`_report_error`). Every built-in command is wrapped in
    it, below its ``@app.command``; typer reads the parameters through ``functools.wraps``."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> _Result:
        try:
            return command(*args, **kwargs)
        except AgentR1Error as exc:
            _fail(exc)

    return run


def _internal_error(exc: BaseException) -> int:
    """Report an exception agent-r1 did not expect (a bug, or a library failing in a new way):
    one line plus how to see the traceback; returns the exit status 1."""
    import traceback

    if _debug():
        traceback.print_exception(exc)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    _print_error(f"internal error: {type(exc).__name__}: {first}")
    if not _debug():
        print(f"set {DEBUG_ENV}=1 for the traceback", file=sys.stderr)
    return 1


def _version_callback(value: bool) -> None:
    if not value:
        return
    import importlib.metadata
    import platform

    import agent_r1

    def version(distribution: str) -> str:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    typer.echo(
        f"agent-r1 {agent_r1.__version__} (torch {version('torch')}, transformers {version('transformers')}, "
        f"python {platform.python_version()})"
    )
    raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        help="print the versions of agent-r1, torch and transformers",
        is_eager=True,
        callback=_version_callback,
    ),
) -> None:
    """End-to-end reinforcement learning for LLM agents that act over many turns with tools."""


# --------------------------------------------------------------------------------------------
# plugins
# --------------------------------------------------------------------------------------------


@plugins_app.command("list")
@reports_errors
def plugins_list(as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """List installed plugins: distribution, version, entry point and components per kind."""
    from agent_r1.registry import PluginLoadWarning, get_registry

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PluginLoadWarning)
        infos = get_registry().plugins()
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
@reports_errors
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
@reports_errors
def config_show(
    config_path: str = typer.Argument(..., help="run config YAML (or a bundled name such as 'demo')"),
    overrides: list[str] = OverridesArg,
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of YAML"),
    check: bool = typer.Option(
        True, "--check/--no-check", help="also run the preflight checks (warnings and failures to stderr)"
    ),
) -> None:
    """Print the resolved, validated run config with every component's defaults filled in.

    Then the preflight checks run (as `agent-r1 check` does, without converting a bundled model):
    their warnings and failures go to stderr, and the exit status is 2 when a check failed (the
    config is printed in full either way). --no-check skips them.
    """
    import yaml

    from agent_r1.config import resolved_dict

    config, components = _load_checked(config_path, overrides)
    data = resolved_dict(config, components)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(yaml.safe_dump(data, sort_keys=False).rstrip())
    if not check:
        return
    from agent_r1.run.preflight import preflight

    report = preflight(config, components, prepare_models=False)
    for item in report.warnings:
        typer.echo(f"warning: {item.name}: {item.message}", err=True)
    for item in report.failures:
        _print_error(f"{item.name}: {item.message}")
    if report.failures:
        typer.echo(
            f"{len(report.failures)} preflight check(s) failed; `agent-r1 check` shows them all", err=True
        )
        raise typer.Exit(2)


@app.command()
@reports_errors
def check(
    config_path: str = typer.Argument(..., help="run config YAML (or a bundled name such as 'demo')"),
    overrides: list[str] = OverridesArg,
    as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
) -> None:
    """Check a run config before training: model, data, context, output directory, prompts.

    The preflight checks: model files, tokenizer, LoRA targets, context length, dataset, trackers,
    output directory and free space, prompt lengths. Exit status 2 when a check fails.
    """
    from agent_r1.run.preflight import preflight

    config, components = _load_checked(config_path, overrides)
    report = preflight(config, components)
    if as_json:
        typer.echo(json.dumps(report.as_dicts(), indent=2))
    else:
        from rich.console import Console

        Console(soft_wrap=False).print(report.table())
        summary = (
            f"{len(report.failures)} failed, {len(report.warnings)} warning(s), {len(report.checks)} checks"
        )
        typer.echo(summary)
    if report.failures:
        raise typer.Exit(2)


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


@models_app.command("list")
@reports_errors
def models_list() -> None:
    """Bundled model names that work offline."""
    from agent_r1.models.bundled import is_prepared, list_bundled_models

    for model in list_bundled_models():
        state = "prepared" if is_prepared(model.name) else "not prepared yet"
        typer.echo(f"{model.name}  ({state})  {model.description}")


@models_app.command("prepare")
@reports_errors
def models_prepare(name: str = typer.Argument("smollm2-135m-instruct")) -> None:
    """Convert a bundled model into a local fp32 checkpoint (done once, then cached)."""
    from agent_r1.models.bundled import prepare_model

    path = prepare_model(name, full_check=True)
    typer.echo(str(path))


# --------------------------------------------------------------------------------------------
# train / demo / rollout / eval / export
# --------------------------------------------------------------------------------------------

AllowConfigChange = typer.Option(
    False,
    "--allow-config-change",
    help="with --resume: continue even though the config differs from the run's (the change is recorded)",
)


@app.command()
@reports_errors
def train(
    config_path: str = typer.Argument(..., help="run config YAML (or a bundled name such as 'demo')"),
    overrides: list[str] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="continue from the last good checkpoint"),
    allow_config_change: bool = AllowConfigChange,
) -> None:
    """Train a policy as the run config says."""
    from agent_r1.run.training import train as run_train

    run_train(config_path, overrides or [], resume=resume, allow_config_change=allow_config_change)


@app.command()
@reports_errors
def demo(
    overrides: list[str] = OverridesArg,
    resume: bool = typer.Option(False, "--resume", help="continue from the last good checkpoint"),
    allow_config_change: bool = AllowConfigChange,
) -> None:
    """The main job: train SmolLM2-135M-Instruct with GRPO to use a calculator tool."""
    from agent_r1.run.training import train as run_train

    run_train("demo", overrides or [], resume=resume, allow_config_change=allow_config_change)


@app.command()
@reports_errors
def rollout(
    config_path: str = typer.Argument(..., help="run config YAML"),
    overrides: list[str] = OverridesArg,
    out: Path = typer.Option(..., "--out", help="trajectories JSONL to write"),
    split: str = typer.Option("train", help="dataset split to draw tasks from"),
    num_tasks: int = typer.Option(8, help="tasks to roll out (each group_size times)"),
) -> None:
    """Collect trajectories with the configured model and environment and save them as JSONL."""
    from agent_r1.run.commands import collect

    count = collect(config_path, overrides or [], out=out, split=split, num_tasks=num_tasks)
    typer.echo(f"wrote {count} trajectories to {out}")


@app.command("serve-policy")
@reports_errors
def serve_policy(
    overrides: list[str] = OverridesArg,
    config_path: str | None = typer.Option(
        None, "--config", help="run config YAML: model, rollout backend, chat template, token limits"
    ),
    model: str | None = typer.Option(None, "--model", help="model directory or bundled name (model.path)"),
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8000, help="port to listen on"),
    served_model_name: str | None = typer.Option(
        None, help="the model name clients send (default: the last part of the model path)"
    ),
    tool_format: str | None = typer.Option(
        None, help="tool-call format that shows tools and reads calls back (default: hermes)"
    ),
    max_new_tokens: int | None = typer.Option(None, help="tokens per call at most (rollout.max_new_tokens)"),
    max_context: int | None = typer.Option(
        None, help="prompt + completion tokens at most (rollout.max_context)"
    ),
    out: Path | None = typer.Option(
        None, "--out", help="append finished episodes' trajectories to this JSONL"
    ),
    episode_idle_s: float = typer.Option(
        900.0,
        "--episode-idle-s",
        help="close an episode with no call, reward or show for this many seconds, as failed "
        "(appended to --out; its id then gets HTTP 409); 0: never",
    ),
) -> None:
    """Serve the policy as an OpenAI-compatible API that records token-faithful episodes.

    /v1/chat/completions (tools, tool calls, streaming), /v1/completions and /v1/models, also under
    /episodes/<id>/v1 to tie calls to an episode; POST /episodes/<id>/reward and
    /episodes/<id>/finish (see docs/gateway.md). An episode id is used once: a finished or idle-closed
    id gets HTTP 409. Needs FastAPI and uvicorn (the gateway extra).
    """
    from agent_r1.gateway.serve import serve_policy as run_server

    run_server(
        config_path,
        overrides or [],
        model=model,
        host=host,
        port=port,
        served_model_name=served_model_name,
        tool_format=tool_format,
        max_new_tokens=max_new_tokens,
        max_context=max_context,
        out=out,
        episode_idle_s=episode_idle_s,
    )


@app.command("eval")
@reports_errors
def evaluate(
    config_path: str = typer.Argument(..., help="run config YAML"),
    overrides: list[str] = OverridesArg,
    checkpoint: Path | None = typer.Option(None, help="checkpoint directory to evaluate"),
    out: Path | None = typer.Option(None, help="directory for eval.json and eval.md"),
    decoding: str | None = typer.Option(
        None,
        help="sample | value_guided | best_of_k (eval.decoding.kind); the last two need "
        "eval.temperature > 0, value_guided the trained critic (--checkpoint of a PPO run)",
    ),
    candidates: int | None = typer.Option(
        None, help="actions sampled per turn for value_guided / best_of_k (eval.decoding.candidates)"
    ),
) -> None:
    """Evaluate a policy on held-out tasks: success/EM/F1, pass@k, tool use, turns."""
    from agent_r1.run.commands import evaluate as run_eval

    extra = [] if decoding is None else [f"eval.decoding.kind={decoding}"]
    extra += [] if candidates is None else [f"eval.decoding.candidates={candidates}"]
    report = run_eval(config_path, [*(overrides or []), *extra], checkpoint=checkpoint, out=out)
    typer.echo(report.get("markdown", json.dumps(report.get("summary", {}), indent=2)))


@app.command()
@reports_errors
def export(
    source: Path = typer.Argument(
        ..., help="run directory (its newest good checkpoint) or checkpoint directory"
    ),
    out: Path = typer.Option(
        ..., "--out", help="directory to write the Hugging Face model into (new or empty)"
    ),
    merge_lora: bool = typer.Option(False, "--merge-lora", help="LoRA runs: write a merged plain model"),
) -> None:
    """Export a run's checkpoint as a Hugging Face model directory.

    Config, safetensors weights, tokenizer, chat template and generation config, loadable by
    transformers and vLLM as they are. LoRA runs export the adapter (peft format), or with
    --merge-lora a merged model.
    """
    from agent_r1.engine.artifacts.export import EXPORT_RECORD, export_checkpoint

    path = export_checkpoint(source, out, merge_lora=merge_lora)
    record = json.loads((path / EXPORT_RECORD).read_text(encoding="utf-8"))
    typer.echo(f"exported {record.get('checkpoint')} (step {record.get('step')}) to {path}")
    if record.get("kind") == "lora-adapter":
        typer.echo(
            "a LoRA adapter: load it with PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("
            f"BASE), '{path}'), BASE being {record.get('base_model')}; --merge-lora writes a plain model"
        )
    else:
        typer.echo(f"load it with AutoModelForCausalLM.from_pretrained('{path}'), or use model.path={path}")


@app.command()
@reports_errors
def view(
    path: Path = typer.Argument(..., help="trajectories JSONL"),
    limit: int = typer.Option(3, help="show at most this many trajectories"),
    tokenizer: str | None = typer.Option(
        None, help="model directory whose tokenizer decodes the tokens, shown coloured by provenance"
    ),
) -> None:
    """Pretty-print trajectories: steps, tool calls and results, rewards, termination, token counts."""
    from agent_r1.engine.reports.viewer import show_trajectories

    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise AgentR1Error(
            f"{path} {what}; `agent-r1 view` takes a trajectories JSONL file such as "
            "<run>/samples.jsonl or <run>/eval_after.jsonl"
        )
    decoder = None
    if tokenizer is not None:
        from transformers import AutoTokenizer

        try:
            decoder = AutoTokenizer.from_pretrained(tokenizer)
        except (OSError, ValueError) as exc:  # transformers' words for a directory it cannot read
            raise AgentR1Error(str(exc)) from exc
    show_trajectories(path, limit=limit, tokenizer=decoder)


# --------------------------------------------------------------------------------------------
# new-plugin
# --------------------------------------------------------------------------------------------


@app.command("new-plugin")
@reports_errors
def new_plugin(
    name: str = typer.Argument(..., help="plugin name, e.g. 'weather' (letters, digits, _ or -)"),
    directory: Path = typer.Option(
        Path("."), "--dir", help="parent directory; the plugin goes to DIR/agent-r1-plugin-<name>"
    ),
) -> None:
    """Scaffold a plugin distribution: a tool, an environment, a dataset, a reward shaper, tests."""
    from agent_r1.scaffold import plugin_names, render_plugin

    names = plugin_names(name)
    project = render_plugin(name, directory)
    typer.echo(f"created {names.distribution} (plugin {names.name!r}) in {project}")
    typer.echo("next:")
    typer.echo(f"  cd {project}")
    typer.echo('  pip install -e ".[test]"')
    typer.echo("  agent-r1 plugins list && pytest")


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: runs the command line; an error agent-r1 raises on purpose exits 2
    with ``error: ...``, any other exception exits 1 with a one-line ``error: internal error``
    (the traceback only under ``AGENT_R1_DEBUG=1``)."""
    try:
        return app(args=argv if argv is not None else sys.argv[1:], prog_name="agent-r1")
    except AgentR1Error as exc:  # raised outside the built-in commands (a plugin command...)
        sys.exit(_report_error(exc))
    except Exception as exc:  # anything else is a bug: one line, exit 1 (KeyboardInterrupt passes)
        sys.exit(_internal_error(exc))


if __name__ == "__main__":  # pragma: no cover
    main()
