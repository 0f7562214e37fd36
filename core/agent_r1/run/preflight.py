"""Preflight: check everything a run needs before any model weights load and before the run
directory is created.

:func:`preflight` takes the validated config and its resolved components and returns a
:class:`PreflightReport`, a list of :class:`Check` results (``ok``, ``warn`` or ``fail``, each with
a message that says what was checked, where, and what to do when it is not right):

- ``device``: ``model.device`` exists (a CUDA device asked for is there);
- ``distributed``: the launch and ``trainer.sharding`` agree: an ``accelerate launch`` with an
  FSDP configuration needs ``trainer.sharding: fsdp2`` (agent-r1 shards the models itself, once,
  with torch's ``fully_shard``, on CPU and GPU alike; accelerate's own FSDP wrapping is never
  applied on top), and DeepSpeed or Megatron-LM launches are refused;
- ``model``: ``model.path`` resolves to a model directory (a bundled model is prepared once), its
  weight files are complete (sizes checked against the safetensors headers; no weights are read);
- ``tokenizer``: tokenizer files are present and load, the chat template renders;
- ``lora``: every ``model.lora.target_modules`` entry names modules of the model (checked on a
  model built from ``config.json`` on the meta device: no memory, no weights);
- ``context``: ``rollout.max_context`` fits the model's position embeddings (a warning for RoPE
  models run beyond their trained length, a failure for learned absolute positions);
- ``data``: the dataset component loads its splits and they are not empty;
- ``trackers``: each tracker can be built (their packages are importable);
- ``component``: each component class that defines an optional ``check(config)`` classmethod
  (corpora present and non-empty, servers reachable...) passes it;
- ``output``: the output directory (or its nearest existing parent) is writable, with the free
  space reported against what the checkpoints and the final export will take;
- ``agent`` (``rollout.source: gateway``, instead of ``prompts``): the agent program can start
  (its program or script exists, or its callable's module is found) and the gateway's packages
  are installed;
- ``prompts``: the first tasks' prompts, rendered as the rollout renders them, fit
  ``rollout.max_context``; when none does the run would train on nothing, which is a failure;
- ``tools``: when the environment offers tools, the first rendered prompt shows every one of them
  (their names, or the tags a ``tags`` format calls them by); tool schemas handed to a chat
  template that leaves them out (SmolLM2's) would leave the model nothing to call, which is a
  failure naming the template and the fixes.

The component hook: a component class may define ``check(cls, config) -> list[str]``, a
classmethod that gets the component's validated config. Each returned string is a failure of its
own (return one per broken server, corpus...); an :class:`~agent_r1.errors.AgentR1Error` it raises
is a failure; a warning it issues (``warnings.warn``) is a warning. It must be cheap and must not
create files. When the check of the environment (or of one of its parts, ``environment.tools[0]``)
fails, the environment is not built again for the ``prompts`` and ``tools`` checks (it would meet
the same problem, and pay its timeouts, twice).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agent_r1.errors import AgentR1Error, did_you_mean

if TYPE_CHECKING:
    from agent_r1.config import ResolvedComponent, RunConfig

__all__ = ["Check", "PreflightError", "PreflightReport", "preflight"]

Status = Literal["ok", "warn", "fail"]

PROMPT_SAMPLE = 16
"""How many of the first train tasks have their prompts rendered and measured."""


class PreflightError(AgentR1Error):
    """A run cannot start: the message lists every failed preflight check."""


@dataclass
class Check:
    """One preflight result: what was checked (``name``), how it went, and the message."""

    name: str
    status: Status
    message: str


@dataclass
class PreflightReport:
    """Every check :func:`preflight` ran, in order."""

    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: Status, message: str) -> None:
        """Record one result."""
        self.checks.append(Check(name, status, message))

    @property
    def failures(self) -> list[Check]:
        """The checks that failed: the run must not start."""
        return [c for c in self.checks if c.status == "fail"]

    @property
    def warnings(self) -> list[Check]:
        """The checks that passed with a warning."""
        return [c for c in self.checks if c.status == "warn"]

    @property
    def ok(self) -> bool:
        """True when nothing failed."""
        return not self.failures

    def raise_on_failure(self) -> None:
        """Raise :class:`PreflightError` listing every failure (nothing happens when all passed)."""
        failures = self.failures
        if not failures:
            return
        lines = "\n".join(f"  - {c.name}: {c.message}" for c in failures)
        raise PreflightError(
            f"preflight found {len(failures)} problem(s); nothing was loaded or created:\n{lines}\n"
            "`agent-r1 check CONFIG` shows every check."
        )

    def as_dicts(self) -> list[dict[str, str]]:
        """The checks as plain dicts (for JSON)."""
        return [{"name": c.name, "status": c.status, "message": c.message} for c in self.checks]

    def table(self) -> Any:
        """A rich table of the checks."""
        from rich.table import Table
        from rich.text import Text

        styles = {"ok": "green", "warn": "yellow", "fail": "bold red"}
        table = Table(title="agent-r1 preflight", show_lines=False)
        table.add_column("check", style="bold")
        table.add_column("status")
        table.add_column("details", overflow="fold")
        for check in self.checks:
            table.add_row(check.name, Text(check.status, style=styles[check.status]), check.message)
        return table


# --------------------------------------------------------------------------------------------
# The checks
# --------------------------------------------------------------------------------------------


@dataclass
class _Context:
    """What later checks need from earlier ones."""

    config: RunConfig
    components: dict[str, ResolvedComponent]
    model_dir: Path | None = None
    hf_config: Any = None
    tokenizer: Any = None
    parameters: int | None = None
    trainable: int | None = None
    module_names: list[str] = field(default_factory=list)
    linear_shapes: dict[str, tuple[int, int]] = field(default_factory=dict)
    train_tasks: list[Any] | None = None
    failed_components: set[str] = field(default_factory=set)
    """Config paths of the components whose own ``check`` failed."""
    renderer: Any = None
    first_prompt: tuple[Any, Any, str] | None = None
    """The environment, its :class:`~agent_r1.EpisodeStart` and the rendered text of the first
    train task's prompt (from the ``prompts`` check, with ``renderer``)."""


def _run(report: PreflightReport, name: str, check: Callable[[], None]) -> None:
    """Run one check; an error it raises becomes a failure of that check, never a traceback, and
    the warnings it issued become warnings (before the failure, in the order they came)."""
    failure: str | None = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            check()
        except AgentR1Error as exc:
            failure = str(exc)
        except Exception as exc:  # a check's own bug or an unexpected library error: shown, not lost
            failure = f"the check itself failed: {type(exc).__name__}: {exc}"
    for warning in caught:
        if issubclass(warning.category, (DeprecationWarning, PendingDeprecationWarning, FutureWarning)):
            continue  # library deprecations are not the user's run problems
        report.add(name, "warn", str(warning.message))
    if failure is not None:
        report.add(name, "fail", failure)


def _check_device(report: PreflightReport, ctx: _Context) -> None:
    from agent_r1.models.loading import pick_device

    device = pick_device(ctx.config.model.device)
    detail = str(device)
    if device.type == "cuda":
        import torch

        detail += f" ({torch.cuda.get_device_name(device)})"
    report.add("device", "ok", f"model.device={ctx.config.model.device!r} gives {detail}")


def _check_model(report: PreflightReport, ctx: _Context, *, prepare_models: bool) -> None:
    from agent_r1.models.bundled import find_bundled_model, is_prepared
    from agent_r1.models.paths import resolve_model_path, weight_problems, weights_message

    path = ctx.config.model.path
    bundled = find_bundled_model(path) if not Path(path).expanduser().exists() else None
    if bundled is not None and not prepare_models and not is_prepared(bundled.name):
        report.add(
            "model",
            "warn",
            f"bundled model {bundled.name!r} is not prepared yet: the first run converts it once "
            "(`agent-r1 models prepare` does it now); the model, tokenizer and prompt checks wait until then",
        )
        return
    directory = resolve_model_path(path)
    problems = weight_problems(directory)
    if problems:
        report.add("model", "fail", weights_message(directory, path, problems))
        return
    from transformers import AutoConfig

    try:
        ctx.hf_config = AutoConfig.from_pretrained(str(directory))
    except Exception as exc:  # transformers raises ValueError/OSError/KeyError for a bad config.json
        report.add("model", "fail", f"{directory}/config.json cannot be read: {type(exc).__name__}: {exc}")
        return
    ctx.model_dir = directory
    size = sum(p.stat().st_size for p in directory.iterdir() if p.suffix in (".safetensors", ".bin"))
    report.add(
        "model",
        "ok",
        f"{directory} ({ctx.hf_config.model_type}, {size / 2**20:.1f} MiB of weights, files complete)",
    )
    critic = ctx.config.algorithm.critic
    if critic.kind == "separate" and critic.path:
        critic_dir = resolve_model_path(critic.path)
        problems = weight_problems(critic_dir)
        status: Status = "fail" if problems else "ok"
        report.add("model", status, f"critic {critic_dir}: {'; '.join(problems) or 'files complete'}")


def _meta_model(ctx: _Context) -> None:
    """Module names and parameter counts from a model built on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ctx.hf_config)
    ctx.module_names = [name for name, _ in model.named_modules() if name]
    ctx.linear_shapes = {
        name: (module.in_features, module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    # Tied weights are one parameter; parameters() yields each once.
    ctx.parameters = sum(p.numel() for p in model.parameters())


def _check_lora(report: PreflightReport, ctx: _Context) -> None:
    lora = ctx.config.model.lora
    if lora is None:
        return
    targets = lora.target_modules
    linear_leaves = sorted({name.rsplit(".", 1)[-1] for name in ctx.linear_shapes})

    def count_adapters(names: list[str]) -> None:
        # A rank-r adapter adds r * (in + out) trained parameters per adapted linear layer; the
        # optimizer keeps state for these only (used for the disk estimate).
        shapes = [ctx.linear_shapes[n] for n in names if n in ctx.linear_shapes]
        ctx.trainable = sum(lora.r * (i + o) for i, o in shapes)

    if targets == "all-linear":
        adapted = [n for n in ctx.linear_shapes if not n.endswith("lm_head")]
        if not adapted:
            raise AgentR1Error("model.lora.target_modules='all-linear' but the model has no linear layers")
        count_adapters(adapted)
        report.add("lora", "ok", f"all-linear: {len(adapted)} linear layers ({', '.join(linear_leaves)})")
        return
    if isinstance(targets, str):
        matched = [n for n in ctx.module_names if re.fullmatch(targets, n)]
        if not matched:
            raise AgentR1Error(
                f"model.lora.target_modules={targets!r} (a regular expression over full module names) "
                f"matches no module of the model; its linear layers are named {', '.join(linear_leaves)}"
            )
        count_adapters(matched)
        report.add("lora", "ok", f"{targets!r} matches {len(matched)} modules")
        return
    leaves = sorted({name.rsplit(".", 1)[-1] for name in ctx.module_names})
    missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in ctx.module_names)]
    if missing:
        hints = "".join(did_you_mean(t, leaves) for t in missing)
        raise AgentR1Error(
            f"model.lora.target_modules: {', '.join(map(repr, missing))} "
            f"{'is' if len(missing) == 1 else 'are'} not a module of the model "
            f"({ctx.hf_config.model_type}).{hints} Its linear layers are: {', '.join(linear_leaves)}."
        )
    adapted = [n for n in ctx.module_names if any(n == t or n.endswith(f".{t}") for t in targets)]
    count_adapters(adapted)
    report.add("lora", "ok", f"{', '.join(targets)}: {len(adapted)} modules")


PACKING_ATTENTION = (None, "sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
"""Attention implementations that keep packed trajectories apart from restarting positions."""


def _check_memory(report: PreflightReport, ctx: _Context) -> None:
    """Peak training memory per process against the device's, and the micro-batch layout."""
    from agent_r1.models.loading import pick_device
    from agent_r1.models.memory import estimate_training_memory, machine_memory_bytes

    config = ctx.config
    trainer = config.trainer
    if trainer.packing and config.model.attn_implementation not in PACKING_ATTENTION:
        raise AgentR1Error(
            f"trainer.packing needs an attention implementation that keeps packed trajectories apart; "
            f"model.attn_implementation={config.model.attn_implementation!r} is not one of "
            f"{', '.join(a for a in PACKING_ATTENTION if a)}: pick one, or set trainer.packing: false"
        )
    if ctx.parameters is None:
        return
    world = int(os.environ.get("WORLD_SIZE", "1"))
    estimate = estimate_training_memory(config, ctx.hf_config, ctx.parameters, ctx.trainable, world=world)
    device = pick_device(config.model.device)
    available = machine_memory_bytes(device)
    where = f"{device.type} memory ({available / 2**30:.1f} GiB)"
    if estimate.total > 0.9 * available:
        report.add(
            "memory",
            "warn",
            f"training may run out of memory: {estimate.summary()} against {where}. Set "
            "trainer.max_tokens_per_micro_batch (a smaller budget), model.gradient_checkpointing: "
            "true, trainer.packing: true, LoRA, or trainer.sharding: fsdp2 over more processes",
        )
    else:
        report.add("memory", "ok", f"{estimate.summary()}; {where}")
    budget = trainer.max_tokens_per_micro_batch
    if budget is not None and budget < config.rollout.max_context:
        report.add(
            "memory",
            "warn",
            f"trainer.max_tokens_per_micro_batch={budget} is below rollout.max_context="
            f"{config.rollout.max_context}: a trajectory longer than the budget trains alone, above "
            "it (counted as batch/over_budget_rows)",
        )


def _is_rope(hf_config: Any) -> bool:
    return any(
        getattr(hf_config, attribute, None) is not None
        for attribute in ("rope_theta", "rope_scaling", "rope_parameters", "rotary_emb_base", "rotary_pct")
    )


def _check_context(report: PreflightReport, ctx: _Context) -> None:
    max_context = ctx.config.rollout.max_context
    positions = None
    for attribute in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(ctx.hf_config, attribute, None)
        if isinstance(value, int) and value > 0:
            positions = value
            break
    if positions is None:
        report.add("context", "warn", "the model's config.json gives no maximum position; not checked")
        return
    if max_context <= positions:
        report.add(
            "context", "ok", f"rollout.max_context={max_context} within the model's {positions} positions"
        )
    elif _is_rope(ctx.hf_config):
        report.add(
            "context",
            "warn",
            f"rollout.max_context={max_context} exceeds the {positions} positions the model was trained "
            f"with (max_position_embeddings); RoPE runs past them, but quality usually drops. Lower "
            f"rollout.max_context to {positions}, or configure RoPE scaling in the model's config.json.",
        )
    else:
        raise AgentR1Error(
            f"rollout.max_context={max_context} exceeds the model's {positions} learned positions; "
            f"longer sequences cannot be encoded. Set rollout.max_context={positions} or less."
        )


def _check_tokenizer(report: PreflightReport, ctx: _Context) -> None:
    from agent_r1.models.loading import load_tokenizer
    from agent_r1.models.paths import tokenizer_problems

    assert ctx.model_dir is not None
    problems = tokenizer_problems(ctx.model_dir)
    if problems:
        raise AgentR1Error(f"cannot load the tokenizer of {ctx.model_dir}: {problems[0]}")
    tokenizer = load_tokenizer(ctx.model_dir)
    try:
        from agent_r1.rollout.templates import apply_chat_template_config
    except ImportError:  # an agent-r1 without configurable chat templates: the tokenizer's own
        pass
    else:
        tokenizer = apply_chat_template_config(tokenizer, ctx.config.model)
    ctx.tokenizer = tokenizer
    template = (
        "with a chat template" if getattr(tokenizer, "chat_template", None) else "WITHOUT a chat template"
    )
    report.add("tokenizer", "ok", f"{type(tokenizer).__name__}, {len(tokenizer)} tokens, {template}")


def _check_data(report: PreflightReport, ctx: _Context) -> None:
    data = ctx.components.get("data")
    if data is None:
        return
    dataset = data.cls(data.config)
    train = dataset.load("train")
    ctx.train_tasks = list(train)
    if not train and ctx.config.trainer.steps > 0:
        raise AgentR1Error(
            f"data ({data.name!r}): the train split is empty, so there is nothing to train on; check the "
            "dataset's files and options (`agent-r1 config show` prints them)"
        )
    eval_split = ctx.config.eval.split
    evaluated = dataset.load(eval_split)
    report.add(
        "data", "ok", f"{data.name}: {len(train)} train tasks, {len(evaluated)} in split {eval_split!r}"
    )
    if not evaluated:
        report.add(
            "data",
            "warn",
            f"{data.name}: split {eval_split!r} (eval.split) has no tasks, so the before/after "
            "evaluation is skipped",
        )


def _check_trackers(report: PreflightReport, ctx: _Context) -> None:
    trackers = [c for path, c in ctx.components.items() if path.startswith("trackers[")]
    for tracker in trackers:
        # Trackers check their packages when built and do their work only in start(), so building
        # one here creates nothing.
        tracker.cls(tracker.config)
    if trackers:
        report.add("trackers", "ok", ", ".join(t.name for t in trackers))


def _check_component_hooks(report: PreflightReport, ctx: _Context) -> None:
    for path, component in ctx.components.items():
        hook = getattr(component.cls, "check", None)
        if hook is None or not callable(hook):
            continue
        label = f"{path} ({component.name})"

        def run(hook: Any = hook, component: Any = component, label: str = label) -> None:
            result = hook(component.config)
            if inspect.iscoroutine(result):
                result = asyncio.run(result)
            problems = [str(p) for p in (result or [])]
            for problem in problems[:-1]:  # one failure each; the last one is raised
                report.add("component", "fail", f"{label}: {problem}")
            if problems:
                raise AgentR1Error(f"{label}: {problems[-1]}")
            report.add("component", "ok", f"{label}: check passed")

        before = len(report.failures)
        _run(report, "component", run)
        if len(report.failures) > before:
            ctx.failed_components.add(path)


def _output_root(output_dir: str) -> Path:
    """The directory a run will write into, or the folder that will hold it for ``{now}`` patterns."""
    if "{now}" in output_dir:
        return Path(output_dir.split("{now}", 1)[0] or ".").expanduser()
    return Path(output_dir).expanduser()


def _check_output(report: PreflightReport, ctx: _Context) -> None:
    from agent_r1.models.loading import _DTYPES

    target = _output_root(ctx.config.output_dir)
    existing = target if target.exists() else next((p for p in target.parents if p.exists()), Path("."))
    if not existing.is_dir():
        raise AgentR1Error(f"output_dir={ctx.config.output_dir!r}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise AgentR1Error(
            f"output_dir={ctx.config.output_dir!r}: {existing} is not writable; choose another output_dir"
        )
    try:  # permissions can lie (read-only mounts, ACLs): write and delete a real file
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise AgentR1Error(
            f"output_dir={ctx.config.output_dir!r}: cannot write in {existing} ({exc.strerror}); choose "
            "another output_dir"
        ) from None
    free = shutil.disk_usage(existing).free
    message = f"{target} writable, {free / 2**30:.2f} GiB free"
    if ctx.parameters is None:
        report.add("output", "ok", message)
        return
    import torch

    dtype = getattr(torch, _DTYPES[ctx.config.model.dtype])
    weight_bytes = ctx.parameters * torch.empty((), dtype=dtype).element_size()
    trained = ctx.trainable if ctx.trainable is not None else ctx.parameters
    # AdamW keeps two fp32 moments per trained parameter; a checkpoint holds weights + moments.
    checkpoint = weight_bytes + 8 * trained
    keep = ctx.config.trainer.keep_checkpoints
    needed_min = checkpoint * 2 + weight_bytes  # one kept + one being written, then the final export
    needed = checkpoint * (keep + 1) + weight_bytes
    estimate = f"about {needed / 2**30:.2f} GiB for {keep} checkpoints, one being written and the final model"
    if free < needed_min:
        raise AgentR1Error(
            f"{message}, but the run needs {estimate}: the disk is nearly full. Free space or choose "
            "another output_dir."
        )
    if free < needed:
        report.add("output", "warn", f"{message}; {estimate}: space is tight")
        return
    report.add("output", "ok", f"{message}; the run needs {estimate}")


def _check_prompts(report: PreflightReport, ctx: _Context) -> None:
    from agent_r1.rollout.chat import ChatRenderer

    env = ctx.components.get("environment")
    if env is None or ctx.tokenizer is None or not ctx.train_tasks:
        return
    failed = sorted(p for p in ctx.failed_components if p == "environment" or p.startswith("environment."))
    if failed:  # building the environment would meet the same problem (and pay its timeouts) again
        which = f"the environment ({env.name})" if failed[0] == "environment" else failed[0]
        report.add(
            "prompts",
            "warn",
            f"not checked: {which} failed its own check above; the prompts and the tools they show "
            "are checked once it passes",
        )
        return
    tasks = ctx.train_tasks[:PROMPT_SAMPLE]
    renderer = ctx.renderer = ChatRenderer(ctx.tokenizer)

    async def starts() -> list[tuple[Any, Any]]:
        started = []
        for task in tasks:
            environment = env.cls(env.config)
            try:
                started.append((environment, await environment.reset(task)))
            finally:  # released as the engine releases an episode (sessions, processes)
                await _close(environment, env.name)
        return started

    texts = []
    for environment, start in asyncio.run(starts()):
        texts.append(renderer.render_text(start.messages, start.tools, add_generation_prompt=True))
        if ctx.first_prompt is None:
            ctx.first_prompt = (environment, start, texts[-1])
    lengths = [len(renderer.encode(text)) for text in texts]
    max_context = ctx.config.rollout.max_context
    too_long = sum(1 for n in lengths if n >= max_context)
    span = f"{min(lengths)}-{max(lengths)} tokens" if min(lengths) != max(lengths) else f"{lengths[0]} tokens"
    if too_long == len(lengths):
        raise AgentR1Error(
            f"every one of the first {len(lengths)} train prompts ({span}, tools and template included) "
            f"fills rollout.max_context={max_context}, so no episode could take a single action and the "
            f"run would train on nothing. Raise rollout.max_context above {max(lengths)} or shorten the "
            "prompts (system prompt, tool descriptions, few-shot turns)."
        )
    room = max_context - max(lengths)
    if too_long:
        report.add(
            "prompts",
            "warn",
            f"{too_long} of the first {len(lengths)} train prompts fill rollout.max_context={max_context} "
            f"({span}); those episodes end before their first action. Raise rollout.max_context.",
        )
    elif room < ctx.config.rollout.max_new_tokens:
        report.add(
            "prompts",
            "warn",
            f"the longest of the first {len(lengths)} prompts ({max(lengths)} tokens) leaves {room} tokens "
            f"of rollout.max_context={max_context}, less than rollout.max_new_tokens="
            f"{ctx.config.rollout.max_new_tokens}: its actions will be cut short",
        )
    else:
        report.add("prompts", "ok", f"first {len(lengths)} train prompts: {span}, max_context {max_context}")


async def _close(environment: Any, name: str) -> None:
    """``environment.aclose()``; a failure is a warning, as the engine keeps such an episode."""
    try:
        await environment.aclose()
    except Exception as exc:
        warnings.warn(
            f"environment ({name}): aclose() after reset raised {type(exc).__name__}: {exc}; a run counts "
            "this in env_close_errors",
            RuntimeWarning,
            stacklevel=1,
        )


def _offered_tools(environment: Any, start: Any) -> dict[str, list[str]]:
    """Each tool the environment offers -> the strings that show it in a prompt: its name, and for
    a format that calls tools by another name (``tags`` with ``tool_tags``) that one too."""
    offered: dict[str, list[str]] = {}
    for schema in start.tools or []:
        function = schema.get("function", schema) if isinstance(schema, Mapping) else {}
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str) and name:
            offered[name] = [name]
    tools = getattr(environment, "tools", None)
    tag_of = getattr(getattr(environment, "format", None), "tag_of", None)
    if isinstance(tools, Mapping):
        for name in tools:
            shown = [str(name)]
            if callable(tag_of):
                shown.append(str(tag_of(name)))
            offered.setdefault(str(name), shown)
    return offered


def _check_tools(report: PreflightReport, ctx: _Context) -> None:
    """Every tool the environment offers appears in the first rendered prompt."""
    from agent_r1.rollout.templates import template_origin

    if ctx.first_prompt is None:
        return
    environment, start, text = ctx.first_prompt
    offered = _offered_tools(environment, start)
    if not offered:
        return
    label = f"environment ({ctx.components['environment'].name})"
    fmt = getattr(environment, "format", None)
    fmt_name = getattr(fmt, "name", None) or "?"
    ignored = False
    if start.tools:  # the probe: does the template render its tools argument at all?
        bare = ctx.renderer.render_text(start.messages, None, add_generation_prompt=True)
        ignored = bare == text
    missing = [name for name, shown in offered.items() if ignored or not any(s in text for s in shown)]
    if not missing:
        where = "the chat template renders their schemas" if start.tools else "the system message names them"
        count = f"{len(offered)} tool{'s' if len(offered) != 1 else ''}"
        report.add("tools", "ok", f"{label}: the first prompt shows its {count} ({where})")
        return
    names = ", ".join(map(repr, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
    template = f"{template_origin(ctx.tokenizer)} (model.path={ctx.config.model.path!r})"
    if start.tools:
        options = type(getattr(environment, "config", None))
        has_option = "tool_schemas" in getattr(options, "model_fields", {})
        system_fix = (
            "environment.tool_schemas: system (the environment writes the schemas into the system message)"
            if has_option
            else "an environment that describes its tools in the system message"
        )
        dropped = "ignores its tools argument" if ignored else "leaves them out"
        raise AgentR1Error(
            f"{label}: the first train prompt, rendered with {template}, does not show the tool(s) "
            f"{names}: format {fmt_name!r} hands their schemas to the chat template, which {dropped}, "
            f"so the model would never call them. Fix one of: {system_fix}; environment.format: tags "
            "(the tools described in the system message); or a chat template that renders tools "
            "(model.chat_template: a Jinja string or a .jinja file)."
        )
    raise AgentR1Error(
        f"{label}: the first train prompt, rendered with {template}, does not show the tool(s) {names}: "
        f"format {fmt_name!r} describes tools in the system message, but it does not name them, so the "
        "model would never call them. Keep environment.include_format_instructions: true, or name the "
        "tools in environment.system_prompt."
    )


def _check_agent(report: PreflightReport, ctx: _Context) -> None:
    from agent_r1.gateway.launcher import check_agent_program
    from agent_r1.gateway.server import require_server_packages

    require_server_packages()
    report.add("agent", "ok", check_agent_program(ctx.config.rollout.agent))


SHARDING_ENV = {
    "ACCELERATE_USE_FSDP": "FSDP",
    "ACCELERATE_USE_DEEPSPEED": "DeepSpeed",
    "ACCELERATE_USE_MEGATRON_LM": "Megatron-LM",
}
"""The variables ``accelerate launch`` sets from its configuration file for sharded training."""


def _check_distributed(report: PreflightReport, ctx: _Context) -> None:
    requested = {
        label: f"{label} ({name}={os.environ[name]})"
        for name, label in SHARDING_ENV.items()
        if os.environ.get(name, "").strip().lower() in {"1", "true", "yes"}
    }
    sharding = ctx.config.trainer.sharding
    others = [text for label, text in requested.items() if label != "FSDP"]
    if others:
        raise AgentR1Error(
            f"this process was launched for sharded training with {', '.join(others)}, which agent-r1 "
            "does not support: use trainer.sharding: fsdp2 with a plain multi-process launch "
            "(accelerate launch --num_processes N, or torchrun) instead (docs/gpu.md, 'Sharded training')"
        )
    if "FSDP" in requested and sharding != "fsdp2":
        raise AgentR1Error(
            f"this process was launched for sharded training with {requested['FSDP']}, but "
            "trainer.sharding is 'none': set trainer.sharding: fsdp2 (agent-r1 shards the models "
            "itself with torch's fully_shard, the same on CPU and GPU), or launch without the FSDP "
            "configuration for DDP (docs/gpu.md, 'Sharded training')"
        )
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rollout = ctx.config.rollout
    if rollout.mode == "async" and rollout.async_worker == "ranks":
        rollers = world - 1
        if world < 2 or (rollout.rollout_processes not in (None, rollers)):
            wanted = 2 if rollout.rollout_processes is None else rollout.rollout_processes + 1
            raise AgentR1Error(
                f"rollout.async_worker ranks trains on one process and rolls out on the others, but {world} "
                f"process(es) were launched: launch {wanted} (torchrun --nproc_per_node {wanted} -m "
                "agent_r1.cli train run.yaml ...), or use rollout.async_worker: thread or process"
            )
        if rollers > 1 and ctx.config.algorithm.dynamic_sampling:
            raise AgentR1Error(
                f"{rollers} rollout processes share out the batches in task-stream order, which dynamic "
                "sampling's refills make unpredictable: launch one rollout process (2 in all), or set "
                "algorithm.dynamic_sampling: false"
            )
        report.add(
            "distributed", "ok", f"rank 0 trains, {rollers} process(es) roll out (rollout.async_worker ranks)"
        )
        return
    if rollout.mode == "async" and world > 1:
        raise AgentR1Error(
            f"rollout.mode async runs beside one training process in this version, but {world} were "
            "launched: start one process (rollout.async_worker: process gives the rollouts their own), "
            "set rollout.async_worker: ranks (rank 0 trains, the others roll out), or use rollout.mode: "
            "sync"
        )
    if sharding == "fsdp2":
        split = "nothing to split on one process" if world == 1 else f"each holds 1/{world}"
        report.add("distributed", "ok", f"FSDP2 sharding over {world} process(es) ({split})")
    else:
        report.add("distributed", "ok", f"data parallel (DDP) over {world} process(es)")


def preflight(
    config: RunConfig,
    components: Sequence[ResolvedComponent],
    *,
    prepare_models: bool = True,
    skip: Collection[str] = (),
) -> PreflightReport:
    """Check what a run needs before any model weights load and before anything is created.

    ``config`` and ``components`` come from :func:`agent_r1.config.load_config` and
    :func:`agent_r1.config.validate_components`. Reads config files, tokenizer files and dataset
    files, builds the model skeleton on the meta device (no weights), builds the environment to
    render the first prompts, and writes (then deletes) one temporary file in the output
    directory's nearest existing folder. With ``prepare_models`` false, a bundled model that is not
    converted yet is not converted (the checks that need its files are skipped with a warning);
    otherwise it is prepared once, as a run would. Never raises for a failed check: each one is a
    ``fail`` entry; call :meth:`PreflightReport.raise_on_failure` to stop. ``skip`` names checks
    not to run (``"output"`` for commands that write elsewhere, ``"prompts"``...).
    """
    report = PreflightReport()
    ctx = _Context(config=config, components={c.path: c for c in components})

    def run(name: str, check: Callable[[], None]) -> None:
        if name not in skip:
            _run(report, name, check)

    run("device", lambda: _check_device(report, ctx))
    run("distributed", lambda: _check_distributed(report, ctx))
    run("model", lambda: _check_model(report, ctx, prepare_models=prepare_models))
    if ctx.hf_config is not None:
        try:
            _meta_model(ctx)
        except Exception as exc:  # a skeleton that cannot be built only costs these two checks
            report.add(
                "model",
                "warn",
                f"could not build the model's skeleton from config.json ({type(exc).__name__}: {exc}); "
                "the LoRA target and disk-space estimates are skipped",
            )
        if ctx.module_names:
            run("lora", lambda: _check_lora(report, ctx))
        if config.trainer.steps > 0:
            run("memory", lambda: _check_memory(report, ctx))
        run("context", lambda: _check_context(report, ctx))
        run("tokenizer", lambda: _check_tokenizer(report, ctx))
    run("data", lambda: _check_data(report, ctx))
    run("trackers", lambda: _check_trackers(report, ctx))
    if "component" not in skip:
        _check_component_hooks(report, ctx)
    run("output", lambda: _check_output(report, ctx))
    if config.rollout.source == "gateway":  # the agent program renders its own prompts
        run("agent", lambda: _check_agent(report, ctx))
    else:
        run("prompts", lambda: _check_prompts(report, ctx))
        run("tools", lambda: _check_tools(report, ctx))
    return report
