"""Run configuration: YAML (omegaconf) + dotlist overrides, validated into a typed :class:`RunConfig`.

Each component section (``environment``, ``data``, ``rewards[i]``, ``algorithm.loss``...) holds a
``name`` plus that component's own options; :func:`validate_components` looks each name up in the
registry and validates the options with the component's own ``Config``, before any model loads.
Errors name the config path, the bad value and, for misspelt keys or names, the closest valid ones.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agent_r1.contracts import ComponentSpec, RewardSpec
from agent_r1.errors import (
    ComponentConflict,
    ComponentNotFound,
    ConfigError,
    did_you_mean,  # noqa: F401  (re-exported: earlier releases defined it here)
    first_error_path,
    suggestions,  # noqa: F401  (re-exported)
    validation_error_message,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoraConfig(_Section):
    """Train LoRA adapters instead of the full model (needs ``pip install agent-r1[peft]``)."""

    r: int = Field(16, ge=1, description="adapter rank")
    alpha: int = Field(32, ge=1, description="adapter scaling (alpha / r multiplies the update)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] | str = Field(
        "all-linear", description="module names to adapt, or 'all-linear'"
    )


class ModelConfig(_Section):
    """The policy model."""

    path: str = Field(
        "smollm2-135m-instruct",
        description="local checkpoint directory, or a bundled model name (see `agent-r1 models`)",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="weights dtype")
    device: str = Field("auto", description="'auto', 'cpu', 'cuda', 'cuda:1'...")
    freeze_embeddings: bool = Field(False, description="keep input embeddings fixed during training")
    gradient_checkpointing: bool = Field(False, description="trade compute for activation memory")
    lora: LoraConfig | None = Field(None, description="null trains every weight")
    attn_implementation: str | None = Field(None, description="e.g. 'sdpa', 'flash_attention_2'")
    chat_template: str | None = Field(
        None,
        description="Jinja chat template replacing the tokenizer's: the template itself (text with "
        "{{ or {%), or the path of a .jinja file; null keeps the tokenizer's",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="extra variables for every apply_chat_template call, e.g. {enable_thinking: false}",
    )


class DecodingConfig(_Section):
    """How each turn's action is chosen (see docs/value_guided.md). ``sample`` draws one action;
    ``value_guided`` draws ``candidates`` actions per episode in one batched backend call and keeps
    the one the trained critic values highest at its last token; ``best_of_k`` keeps the one a
    verifier scores highest. Ties go to the first candidate, i.e. the plain sample."""

    kind: Literal["sample", "value_guided", "best_of_k"] = Field(
        "sample", description="'sample' (one action per turn), 'value_guided' or 'best_of_k'"
    )
    candidates: int = Field(4, ge=1, description="value_guided / best_of_k: actions sampled per turn (K)")
    verifier: str = Field(
        "format",
        description="best_of_k: 'format' (1 when the environment parses the action into a tool call "
        "or an answer without errors, else 0) or a Python path module:function, called as "
        "fn(action, messages) -> float",
    )
    critic: str | None = Field(
        None,
        description="value_guided in evaluation: a run directory, checkpoint or exported model (with "
        "its critic/ folder) holding the trained critic; null: the evaluated checkpoint, else "
        "model.path's critic/ folder",
    )
    critic_batch_size: int = Field(16, ge=1, description="value_guided: sequences per critic forward pass")

    def check_temperature(self, temperature: float, where: str) -> None:
        """Several candidates at temperature 0 are one greedy action K times: refuse that."""
        if self.kind != "sample" and self.candidates > 1 and temperature == 0.0:
            raise ValueError(
                f"{where}.decoding.kind={self.kind} with {self.candidates} candidates at "
                f"{where}.temperature=0 (greedy) draws the same action {self.candidates} times; set "
                f"{where}.temperature > 0 (e.g. 1.0)"
            )


class AgentProgramConfig(_Section):
    """The user's agent program, launched once per episode when ``rollout.source`` is ``gateway``
    (see docs/gateway.md). It gets the gateway through ``OPENAI_BASE_URL`` (an episode's own URL),
    ``OPENAI_API_KEY``, ``AGENT_R1_MODEL`` and ``AGENT_R1_EPISODE_ID``, the task as JSON on stdin
    and in ``AGENT_R1_TASK``, and prints its final answer as the last line of stdout."""

    command: list[str] | None = Field(
        None,
        description="the program and its arguments, e.g. [python, my_agent.py] (no shell); a relative "
        "program path is relative to cwd",
    )
    callable: str | None = Field(
        None,
        description="instead of command: a Python function 'module:function' called as fn(task) in a "
        "fresh process; its return value is the final answer (may be async)",
    )
    timeout_s: float = Field(
        300.0, gt=0, description="an episode's program is killed after this many seconds"
    )
    max_concurrent: int | None = Field(
        None, ge=1, description="programs running at once; null runs every episode of a rollout at once"
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    cwd: str | None = Field(None, description="working directory of the program (default: the current one)")

    @model_validator(mode="after")
    def _one_program(self) -> AgentProgramConfig:
        if self.command is not None and self.callable is not None:
            raise ValueError("set either command or callable, not both")
        if self.command is not None and not self.command:
            raise ValueError("command is empty; give the program and its arguments, e.g. [python, agent.py]")
        return self


class GatewayConfig(_Section):
    """The in-process policy gateway of ``rollout.source: gateway`` (an OpenAI-compatible server on
    127.0.0.1; see docs/gateway.md)."""

    host: str = Field("127.0.0.1", description="address the gateway listens on")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    served_model_name: str | None = Field(
        None, description="the model name agents send; null: the last part of model.path"
    )
    tool_call_format: ComponentSpec | None = Field(
        None,
        description="how tools are shown to the model and its tool calls read back into OpenAI "
        "tool_calls (a tool-call format component); null: hermes (<tool_call> JSON) without an "
        "answer tag",
    )
    request_timeout_s: float = Field(600.0, gt=0, description="a call that takes longer gets HTTP 504")
    batch_wait_s: float = Field(
        0.02, ge=0, description="how long the gateway waits for more calls to batch with the first"
    )
    structured_output: Literal["refuse", "prompted"] = Field(
        "refuse",
        description="a request asking for JSON output (response_format, text.format): 'refuse' answers "
        "HTTP 400; 'prompted' adds the schema to the system message as an instruction (sampling stays "
        "unconstrained, so a reply may not be valid JSON)",
    )


class RolloutConfig(_Section):
    """How episodes are sampled during training."""

    backend: ComponentSpec = Field(
        default_factory=lambda: ComponentSpec(name="hf"), description="rollout backend component"
    )
    group_size: int = Field(4, ge=1, description="samples per task (G)")
    max_turns: int = Field(4, ge=1, description="actions per episode at most")
    max_new_tokens: int = Field(256, ge=1, description="tokens per action at most")
    max_context: int = Field(2048, ge=16, description="tokens per trajectory at most (prompt included)")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass (1 disables)")
    top_k: int = Field(0, ge=0, description="sample among the k likeliest tokens (0 disables)")
    decoding: DecodingConfig = Field(
        default_factory=DecodingConfig,
        description="how each turn's action is chosen in training rollouts (value_guided needs a critic)",
    )

    @model_validator(mode="after")
    def _check_decoding(self) -> RolloutConfig:
        self.decoding.check_temperature(self.temperature, "rollout")
        return self

    source: Literal["engine", "gateway"] = Field(
        "engine",
        description="'engine': agent-r1's agent loop with the configured environment; 'gateway': the "
        "user's own agent program (rollout.agent) calls an OpenAI-compatible policy gateway",
    )
    agent: AgentProgramConfig = Field(
        default_factory=AgentProgramConfig, description="the agent program (rollout.source: gateway)"
    )
    gateway: GatewayConfig = Field(
        default_factory=GatewayConfig, description="the policy gateway (rollout.source: gateway)"
    )

    mode: Literal["sync", "async"] = Field(
        "sync",
        description="'async': a background rollout thread on its own copy of the policy samples the "
        "next steps' episodes while the trainer updates, within rollout.max_staleness updates of "
        "the newest weights (docs/rollout.md, 'Asynchronous rollouts'); 'sync': rollout, then update",
    )
    max_staleness: int = Field(
        1,
        ge=0,
        description="async: a trajectory trained at update n started with weights of update n - "
        "max_staleness or newer (0 reproduces sync mode exactly)",
    )

    async_worker: Literal["thread", "process", "ranks"] = Field(
        "thread",
        description="async: where the rollouts run: a thread of the training process on a copy of "
        "the policy, a worker process of their own (weights through shared memory), or the other "
        "processes of a torchrun / accelerate launch whose rank 0 trains (weights and trajectories "
        "through torch.distributed)",
    )
    async_batches: int | None = Field(
        None,
        ge=1,
        description="async_worker thread or ranks: how many batches may be rolled out at once (per "
        "rollout process), each on a backend of its own over the rollout copy of the weights, so that "
        "the next batch starts while the previous one's slow episodes finish; unset: max_staleness + 1 "
        "(the most the bound lets start); 1 with dynamic sampling, the gateway source or vllm",
    )
    rollout_processes: int | None = Field(
        None,
        ge=1,
        description="async_worker ranks: how many launched processes roll out (the launch must "
        "start this many plus one trainer); unset: every process but rank 0",
    )

    @model_validator(mode="after")
    def _check_source(self) -> RolloutConfig:
        if (
            self.mode == "async"
            and self.async_worker != "thread"
            and (self.source != "engine" or self.backend.name != "hf")
        ):
            raise ValueError(
                f"rollout.async_worker {self.async_worker!r} runs agent-r1's own agent loop on the 'hf' "
                f"backend; got rollout.source={self.source!r} and rollout.backend {self.backend.name!r}: "
                "use rollout.async_worker: thread for these"
            )
        if self.source == "gateway":
            if self.agent.command is None and self.agent.callable is None:
                raise ValueError(
                    "rollout.source is 'gateway' but no agent program is set: give rollout.agent.command "
                    "(e.g. [python, my_agent.py]) or rollout.agent.callable (module:function)"
                )
            if self.decoding.kind != "sample":
                raise ValueError(
                    f"rollout.decoding.kind={self.decoding.kind} needs agent-r1's own agent loop; with "
                    "rollout.source 'gateway' the agent program decides its turns (use kind: sample)"
                )
        return self


class KLConfig(_Section):
    """KL penalty against the reference (initial) policy."""

    coef: float = Field(0.0, ge=0.0, description="beta; 0 loads no reference model at all")
    estimator: Literal["k1", "k2", "k3"] = Field("k3", description="per-token KL estimator")
    placement: Literal["loss", "reward"] = Field(
        "loss", description="add the KL term to the loss, or subtract it from the token rewards"
    )
    target: float | None = Field(None, description="adaptive beta aims at this KL per token")
    horizon: int = Field(10000, ge=1, description="adaptive controller horizon (samples)")


class CriticConfig(_Section):
    """The value model, for estimators that need one (``gae``)."""

    kind: Literal["value_head", "separate"] = Field(
        "value_head", description="value head on the policy backbone, or a separate model"
    )
    path: str | None = Field(None, description="model for a separate critic (defaults to model.path)")
    lr: float = Field(1e-5, gt=0, description="critic learning rate")
    value_clip: float | None = Field(0.2, description="PPO value clipping range; null disables")
    coef: float = Field(0.5, ge=0, description="weight of the value loss in the total loss")


class RolloutCorrectionConfig(_Section):
    """Importance sampling against the rollout/trainer mismatch: the rollout backend (vLLM: other
    kernels, other precision) samples from a slightly different policy than the trainer's π_old.
    The ratio ``π_old / π_rollout`` is taken per token or per sequence (the product over its policy
    tokens); ``truncate`` multiplies the loss by ``min(ratio, cap)``, ``mask`` drops the tokens (or
    sequences) whose ratio lies outside ``[1/cap, cap]``. The mismatch metrics are logged either way."""

    mode: Literal["off", "truncate", "mask"] = Field(
        "off", description="'off' (log the mismatch only), 'truncate' (TIS) or 'mask' (MIS)"
    )
    level: Literal["token", "sequence"] = Field("token", description="ratio per token or per sequence")
    cap: float = Field(2.0, gt=1.0, description="C: truncate at C, or keep ratios in [1/C, C]")


class AlgorithmConfig(_Section):
    """The RL algorithm: a named bundle of estimator, loss and aggregation, with overrides."""

    name: str = Field("grpo", description="algorithm component (`agent-r1 plugins list`)")
    estimator: ComponentSpec | None = Field(
        None,
        description="override the algorithm's estimator (options merge over the preset's when the name "
        "is the preset's); validation fills in the effective one",
    )
    loss: ComponentSpec | None = Field(
        None,
        description="override the algorithm's policy loss (options merge over the preset's when the "
        "name is the preset's); validation fills in the effective one",
    )
    aggregation: (
        Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] | None
    ) = Field(None, description="how token losses are averaged; null: the algorithm's choice")
    kl: KLConfig = Field(default_factory=KLConfig)
    entropy_coef: float = Field(0.0, ge=0.0, description="entropy bonus weight (0 disables)")
    critic: CriticConfig = Field(default_factory=CriticConfig)
    dynamic_sampling: bool = Field(False, description="DAPO: drop zero-variance groups and refill")
    max_refill_rounds: int = Field(2, ge=0, description="dynamic sampling: extra rollout rounds at most")
    mask_truncated: bool = Field(False, description="DAPO: truncated trajectories carry no loss")
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig,
        description="importance sampling against the rollout/trainer log-probability mismatch",
    )
    tis_cap: float | None = Field(
        None,
        description="deprecated alias: tis_cap: C is rollout_correction {mode: truncate, level: token, "
        "cap: C}; validation moves it there",
    )

    @model_validator(mode="after")
    def _migrate_tis_cap(self) -> AlgorithmConfig:
        if self.tis_cap is None:
            return self
        correction = self.rollout_correction
        if correction.mode != "off" and (correction.mode, correction.level, correction.cap) != (
            "truncate",
            "token",
            self.tis_cap,
        ):
            raise ValueError(
                f"algorithm.tis_cap={self.tis_cap} conflicts with algorithm.rollout_correction "
                f"({correction.mode}, {correction.level}, cap {correction.cap}); tis_cap is a deprecated "
                "alias: remove it and keep rollout_correction"
            )
        if self.tis_cap <= 1.0:
            raise ValueError(f"algorithm.tis_cap must exceed 1, got {self.tis_cap}")
        warnings.warn(
            "algorithm.tis_cap is deprecated: write algorithm.rollout_correction: "
            f"{{mode: truncate, level: token, cap: {self.tis_cap}}}",
            FutureWarning,
            stacklevel=2,
        )
        self.rollout_correction = RolloutCorrectionConfig(mode="truncate", level="token", cap=self.tis_cap)
        self.tis_cap = None
        return self


class ShardingConfig(_Section):
    """How ``trainer.sharding: fsdp2`` splits the trained models across processes (torch's
    ``fully_shard``; see docs/gpu.md)."""

    reshard_after_forward: bool = Field(
        True,
        description="free a block's gathered parameters after its forward pass (less memory; "
        "gathered again for backward)",
    )
    cpu_offload: bool = Field(
        False, description="keep the parameter, gradient and optimizer shards in CPU memory"
    )
    param_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        None, description="dtype of the gathered parameters in forward/backward (None: as loaded)"
    )
    reduce_dtype: Literal["fp32", "bf16", "fp16"] | None = Field(
        None, description="dtype of the gradient reduce-scatter (None: the parameters' dtype)"
    )
    wrap: list[str] = Field(
        default_factory=list,
        description="class names of the blocks that get their own unit (empty: the model's "
        "_no_split_modules, its decoder layers)",
    )


class TrainerConfig(_Section):
    """The optimisation loop."""

    steps: int = Field(20, ge=0, description="training steps (rollout, then update) to run")
    tasks_per_step: int = Field(4, ge=1, description="tasks rolled out per step (each group_size times)")
    epochs: int = Field(1, ge=1, description="passes over each step's batch")
    mini_batches: int = Field(1, ge=1, description="optimizer steps per epoch")
    micro_batch_size: int = Field(4, ge=1, description="trajectories per forward/backward")
    max_tokens_per_micro_batch: int | None = Field(
        None,
        ge=1,
        description="token budget of a forward/backward (rows x longest row, or the packed row's "
        "length with packing): rows are grouped by length to fit it, overriding micro_batch_size; "
        "a trajectory longer than the budget runs alone. null: micro_batch_size rows",
    )
    packing: bool = Field(
        False,
        description="lay a micro-batch's trajectories end to end in one row (no padding; attention "
        "kept within each trajectory by restarting positions); needs sdpa, eager or flash attention",
    )
    lr: float = Field(1e-5, gt=0, description="policy learning rate (AdamW)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas")
    schedule: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule after warm-up"
    )
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up")
    grad_clip: float | None = Field(1.0, gt=0, description="max gradient norm; null disables clipping")
    checkpoint_every: int = Field(10, ge=0, description="0 saves only at the end")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    skip_idle_rows: bool = Field(
        True,
        description="skip the forward/backward of trajectories whose advantages are all zero when "
        "nothing else needs them (same update, less compute)",
    )
    max_bad_steps: int = Field(
        3,
        ge=1,
        description="abort after this many non-finite losses or gradients in a row (updates without "
        "a gradient do not break the row)",
    )
    max_error_rate: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="stop when a larger share of a step's episodes fail outside the agent's control "
        "(an environment step or a reward shaper raised); such episodes are never trained on",
    )
    eval_every: int = Field(0, ge=0, description="0 evaluates only before and after training")
    sharding: Literal["none", "fsdp2"] = Field(
        "none",
        description="'fsdp2': split parameters, gradients and optimizer state across the processes "
        "(torch's fully_shard; CPU with gloo, GPUs with NCCL); 'none': every process holds everything (DDP)",
    )
    fsdp: ShardingConfig = Field(default_factory=ShardingConfig, description="options of sharding: fsdp2")


class EvalConfig(_Section):
    """Evaluation on held-out tasks, before and after training."""

    split: str = Field("eval", description="dataset split to evaluate on")
    num_tasks: int = Field(64, ge=1, description="evaluate on the first this many tasks of the split")
    samples: int = Field(1, ge=1, description="samples per task (pass@k uses k <= samples)")
    pass_k: list[int] = Field(
        default_factory=lambda: [1, 2, 4, 8, 16],
        description="the k of the pass@k figures (those above eval.samples are left out), e.g. [1, 10, 100]",
    )
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy")
    before_training: bool = Field(True, description="also evaluate the untrained model")
    success_signal: str = Field("answer_match", description="reward signal that decides success")
    decoding: DecodingConfig = Field(
        default_factory=DecodingConfig,
        description="how each turn's action is chosen in evaluation (value_guided loads the trained critic)",
    )

    @model_validator(mode="after")
    def _check_samples(self) -> EvalConfig:
        if any(k < 1 for k in self.pass_k):
            raise ValueError(f"pass_k values must be >= 1, got {self.pass_k}")
        self.decoding.check_temperature(self.temperature, "eval")
        if self.samples > 1 and self.temperature == 0.0:
            import warnings

            warnings.warn(
                f"eval.samples={self.samples} at eval.temperature=0 (greedy): every sample of a task is "
                "the same, so pass@k equals pass@1; set eval.temperature > 0 to sample",
                stacklevel=2,
            )
        return self


def _min_reward_rise() -> Any:
    """The ``min_reward_rise`` option of the alarms that trip only while the reward rises."""
    return Field(
        0.15, gt=0.0, description="trip only when reward/score_mean rose at least this much over the window"
    )


class AuditGapConfig(_Section):
    """The trained reward rises while an audit does not. An audit is a reward
    signal the run reports but does not train on (weight 0, e.g. ``code_solved`` next to a trained
    ``code_tests``) or held-out success (``eval/success``). Both rises are least-squares fits over
    the window, in the signals' own units: name audits on the scale of the score (0..1)."""

    enabled: bool = Field(True, description="watch for this alarm")
    signals: list[str] = Field(
        default_factory=list,
        description="reward signals that audit the trained reward (reward/<signal> each step), e.g. "
        "[code_solved]; usually shapers of weight 0",
    )
    use_eval: bool = Field(
        True,
        description="also audit with held-out success (eval/success) when trainer.eval_every > 0; the "
        "evaluation before training counts as step 0",
    )
    window: int = Field(20, ge=3, description="steps over which the per-step trends are fitted")
    eval_points: int = Field(
        3, ge=2, description="evaluations (the latest ones) over which the held-out trend is fitted"
    )
    min_reward_rise: float = _min_reward_rise()
    max_gap: float = Field(
        0.75,
        ge=0.0,
        description="trip when more than this share of the reward's rise is not followed by the audit "
        "(1 - audit rise / reward rise; 0.75: the audit rose less than a quarter as much)",
    )

    @model_validator(mode="after")
    def _check_signals(self) -> AuditGapConfig:
        if any(not name.strip() for name in self.signals):
            raise ValueError("signals holds an empty name; give reward signal names, e.g. [code_solved]")
        repeated = sorted({name for name in self.signals if self.signals.count(name) > 1})
        if repeated:
            raise ValueError(f"signals lists {', '.join(map(repr, repeated))} more than once")
        return self


class _DropAlarm(_Section):
    """The options that the alarms of a figure falling while the reward jumps share (each alarm's
    own options follow them)."""

    enabled: bool = Field(True, description="watch for this alarm")
    window: int = Field(20, ge=3, description="steps over which the trends are fitted")
    min_reward_rise: float = _min_reward_rise()


def _max_drop(default: float, metric: str) -> Any:
    """The ``max_drop`` option of a :class:`_DropAlarm` that watches ``metric``."""
    return Field(
        default,
        gt=0.0,
        le=1.0,
        description=f"trip when {metric} fell by more than this share of its value at the window's start",
    )


class LengthDropConfig(_DropAlarm):
    """The reward jumps while responses get much shorter (a policy that found an answer the reward
    pays for without the work)."""

    max_drop: float = _max_drop(0.3, "response/length_mean")


class ToolDropConfig(_DropAlarm):
    """The reward jumps while the agent stops using its tools."""

    max_drop: float = _max_drop(0.5, "tools/calls_mean")
    min_calls: float = Field(
        0.2,
        gt=0.0,
        description="watch only while the window starts at this many tool calls per trajectory or more",
    )


class SuspectConfig(_Section):
    """Rewarded trajectories whose reward came through a path a plugin flagged as suspicious
    (``suspect/<path>``, see docs/reward_hacking.md)."""

    enabled: bool = Field(True, description="watch for this alarm")
    rewarded_above: float = Field(
        0.0, description="a trajectory counts as rewarded when its score is above this"
    )
    max_rate: float = Field(
        0.05,
        ge=0.0,
        lt=1.0,
        description="trip when more than this share of the step's rewarded trajectories is flagged",
    )
    min_rewarded: int = Field(
        1, ge=1, description="judge a step only when it has at least this many rewarded trajectories"
    )


class DisagreementConfig(_Section):
    """A reward model and a verifier (two reward signals) disagree on many trajectories, or on
    more and more of them. A trajectory is judged good by a signal when the signal's unweighted
    value reaches its threshold; it counts when it carries both signals."""

    enabled: bool = Field(True, description="watch for this alarm (once both signals are named)")
    reward_model: str | None = Field(
        None, description="the learned judge's signal, e.g. reward_model or llm_judge; null: no alarm"
    )
    verifier: str | None = Field(
        None, description="the rule-based verifier's signal, e.g. answer_match; null: no alarm"
    )
    reward_model_threshold: float = Field(0.5, description="reward_model value that counts as good")
    verifier_threshold: float = Field(0.5, description="verifier value that counts as good")
    max_rate: float = Field(
        0.3, ge=0.0, lt=1.0, description="trip when more than this share of the step's trajectories disagree"
    )
    max_rise: float = Field(
        0.15,
        gt=0.0,
        le=1.0,
        description="trip when the disagreement rate rose more than this over the window",
    )
    window: int = Field(20, ge=3, description="steps over which the rise is fitted")

    @model_validator(mode="after")
    def _both_or_neither(self) -> DisagreementConfig:
        if (self.reward_model is None) != (self.verifier is None):
            given, missing = (
                ("reward_model", "verifier") if self.verifier is None else ("verifier", "reward_model")
            )
            raise ValueError(f"{given} is set but {missing} is not: name both signals to compare, or neither")
        if self.reward_model is not None and self.reward_model == self.verifier:
            raise ValueError(
                f"reward_model and verifier are both {self.reward_model!r}: name two different signals"
            )
        return self

    @property
    def configured(self) -> bool:
        """Whether both signals are named."""
        return self.reward_model is not None and self.verifier is not None


class HealthConfig(_Section):
    """Reward-hacking alarms (docs/reward_hacking.md). Each training step the runner compares the
    step's metrics with the recent past and logs ``health/<alarm>`` (1 while the alarm is on) with
    the figures behind it; it prints a line when an alarm trips and when it clears."""

    enabled: bool = Field(True, description="watch the alarms at all (false: no health/ metrics)")
    action: Literal["warn", "stop"] = Field(
        "warn", description="when an alarm trips: 'warn' (print, log, go on) or 'stop' the run with an error"
    )
    patience: int = Field(
        2,
        ge=1,
        description="an alarm trips after this many flagged verdicts in a row (steps; evaluations for "
        "held-out success), and clears after as many calm ones",
    )
    audit_gap: AuditGapConfig = Field(default_factory=AuditGapConfig)
    length_drop: LengthDropConfig = Field(default_factory=LengthDropConfig)
    tool_drop: ToolDropConfig = Field(default_factory=ToolDropConfig)
    suspect: SuspectConfig = Field(default_factory=SuspectConfig)
    disagreement: DisagreementConfig = Field(default_factory=DisagreementConfig)


class RunConfig(_Section):
    """The whole run. ``agent-r1 config show`` prints the resolved, validated form."""

    seed: int = Field(0, description="seeds sampling, data order and initialisation")
    output_dir: str = Field(
        "runs/default", description="run directory: metrics, samples, checkpoints, reports"
    )
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: ComponentSpec = Field(
        default_factory=lambda: ComponentSpec(name="arithmetic"), description="dataset component"
    )
    environment: ComponentSpec = Field(
        default_factory=lambda: ComponentSpec(name="calculator"), description="environment component"
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    rewards: list[RewardSpec] = Field(
        default_factory=lambda: [RewardSpec(name="answer_match")],
        description="reward shaper components, each with a weight",
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    health: HealthConfig = Field(
        default_factory=HealthConfig, description="reward-hacking alarms (docs/reward_hacking.md)"
    )
    trackers: list[ComponentSpec] = Field(
        default_factory=lambda: [ComponentSpec(name="jsonl")], description="metric tracker components"
    )

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.rollout.mode == "async" and self.trainer.sharding != "none":
            raise ValueError(
                "rollout.mode async runs beside one unsharded training process in this version: set "
                "trainer.sharding: none, or rollout.mode: sync"
            )
        if self.trainer.micro_batch_size > self.trainer.tasks_per_step * self.rollout.group_size:
            self.trainer.micro_batch_size = self.trainer.tasks_per_step * self.rollout.group_size
        return self


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def bundled_config_names() -> tuple[str, ...]:
    """Names of the configs that ship with agent-r1 (the ``*.yaml`` files of ``agent_r1/configs``),
    sorted."""
    directory = resources.files("agent_r1") / "configs"
    if not directory.is_dir():
        return ()
    return tuple(
        sorted(item.name[: -len(".yaml")] for item in directory.iterdir() if item.name.endswith(".yaml"))
    )


BUNDLED_CONFIGS = bundled_config_names()
"""Names of the bundled configs (``demo``...), as found on disk when agent-r1 was imported."""


def bundled_config_path(name: str) -> Path | None:
    """Path of a config that ships with agent-r1 (``demo``...), or ``None``."""
    candidate = resources.files("agent_r1") / "configs" / f"{name}.yaml"
    return Path(str(candidate)) if candidate.is_file() else None


_OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])*")


def _parse_override(override: str) -> tuple[str, Any]:
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"bad override {override!r}: expected KEY=VALUE with a dotted key, e.g. rollout.max_turns=4",
            path=key or None,
        )
    if key.startswith("+"):
        key = key[1:]
    if not _OVERRIDE_KEY.fullmatch(key):
        raise ConfigError(
            f"bad override {override!r}: {key!r} is not a dotted config path such as rollout.max_turns, "
            "rewards.0.weight or rewards[0].weight",
            path=key,
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"bad override {override!r}: cannot parse value {raw!r}: {exc}", path=key) from None
    return key, value


def load_raw_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """YAML file (or bundled name) merged with dotlist overrides, as plain data (not validated)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    # Seeding with the defaults lets overrides address keys and list items the file leaves out.
    base: Any = OmegaConf.create(RunConfig().model_dump(mode="json"))
    if path is not None:
        file = Path(path)
        if not file.exists():
            bundled = bundled_config_path(str(path))
            if bundled is None:
                bundled_names = ", ".join(bundled_config_names())
                raise ConfigError(
                    f"config file {str(path)!r} does not exist (bundled configs: {bundled_names})"
                )
            file = bundled
        try:
            loaded = OmegaConf.load(file)
        except (OmegaConfBaseException, yaml.YAMLError, OSError) as exc:
            raise ConfigError(f"cannot read config {file}: {exc}") from None
        if not OmegaConf.is_dict(loaded):
            raise ConfigError(f"config {file} must be a mapping at the top level")
        try:
            base = OmegaConf.merge(base, loaded)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"config {file} does not fit the run config layout: {exc}") from None
    for override in overrides:
        key, value = _parse_override(override)
        try:
            OmegaConf.update(base, key, value, merge=True, force_add=True)
        except (OmegaConfBaseException, ValueError, TypeError, IndexError) as exc:
            hint = ""
            if "index out of range" in str(exc):
                hint = (
                    ". An override can change a list item but not add one; to add one, give the whole "
                    "list, e.g. 'rewards=[{name: answer_match}, {name: format, weight: 0.1}]'"
                )
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"cannot apply override {override!r}: {first}{hint}", path=key) from None
    try:
        data = OmegaConf.to_container(base, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"cannot resolve config interpolation: {exc}") from None
    assert isinstance(data, dict)
    return {str(k): v for k, v in data.items()}


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Load, merge and validate a run config (component sections are checked separately)."""
    data = load_raw_config(path, overrides)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(
            validation_error_message(exc, model=RunConfig), path=first_error_path(exc)
        ) from None


# --------------------------------------------------------------------------------------------
# Component sections
# --------------------------------------------------------------------------------------------


@dataclass
class ResolvedComponent:
    path: str
    kind: str
    name: str
    cls: type
    config: Any
    nested: bool = False
    """True for components another component requires (they live inside its section)."""


def component_sections(config: RunConfig) -> list[tuple[str, str, ComponentSpec]]:
    """``(config path, kind, spec)`` for every component the run names directly."""
    sections: list[tuple[str, str, ComponentSpec]] = [
        ("data", "datasets", config.data),
        ("environment", "environments", config.environment),
        ("rollout.backend", "rollout_backends", config.rollout.backend),
        ("algorithm", "algorithms", ComponentSpec(name=config.algorithm.name)),
    ]
    if config.algorithm.estimator is not None:
        sections.append(("algorithm.estimator", "advantage_estimators", config.algorithm.estimator))
    if config.algorithm.loss is not None:
        sections.append(("algorithm.loss", "policy_losses", config.algorithm.loss))
    sections += [(f"rewards[{i}]", "reward_shapers", spec) for i, spec in enumerate(config.rewards)]
    sections += [(f"trackers[{i}]", "trackers", spec) for i, spec in enumerate(config.trackers)]
    spec = config.rollout.gateway.tool_call_format
    if config.rollout.source == "gateway" and spec is not None:
        sections.append(("rollout.gateway.tool_call_format", "tool_call_formats", spec))
    return sections


def _options(spec: ComponentSpec) -> dict[str, Any]:
    options = spec.options
    if isinstance(spec, RewardSpec):
        options.pop("weight", None)
    return options


def validate_components(config: RunConfig, registry: Any = None) -> list[ResolvedComponent]:
    """Resolve every component name in ``config`` and validate its options, recursively through
    :meth:`~agent_r1.contracts.Component.requires`. Raises :class:`ConfigError` naming the path."""
    from agent_r1.registry import KIND_LABELS, get_registry

    registry = registry or get_registry()
    _apply_algorithm_preset(config, registry)
    resolved: list[ResolvedComponent] = []
    pending: list[tuple[str, str, str, Mapping[str, Any], bool]] = [
        (path, kind, spec.name, _options(spec), False) for path, kind, spec in component_sections(config)
    ]
    while pending:
        path, kind, name, options, nested = pending.pop(0)
        try:
            cls = registry.get(kind, name)
        except (ComponentNotFound, ComponentConflict) as exc:
            raise ConfigError(f"{path}.name: {exc}", path=f"{path}.name") from None
        try:
            validated = cls.Config.model_validate(dict(options))
        except ValidationError as exc:
            label = f"{KIND_LABELS[kind]} {name!r}"
            raise ConfigError(
                validation_error_message(exc, prefix=label, model=cls.Config, root=path),
                path=first_error_path(exc, path),
            ) from None
        resolved.append(ResolvedComponent(path, kind, name, cls, validated, nested))
        for i, requirement in enumerate(cls.requires(validated)):
            sub_kind, sub_name, sub_options = requirement[:3]
            sub_path = f"{path}.{requirement[3]}" if len(requirement) > 3 else f"{path}<requires {i}>"
            pending.append((sub_path, sub_kind, sub_name, sub_options, True))
    return resolved


def _apply_algorithm_preset(config: RunConfig, registry: Any) -> None:
    """Write the algorithm preset's estimator, loss and aggregation into ``config.algorithm``, under
    the user's overrides, so that the config holds the values the run will use.

    An override that names the preset's own estimator (or loss) is merged over the preset's options
    (``algorithm: {name: dapo, loss: {name: ppo_clip, clip_high: 0.3}}`` keeps DAPO's ``clip_low``);
    one that names another component replaces the preset's choice, options and all.
    """
    try:
        preset = registry.get("algorithms", config.algorithm.name)
    except (ComponentNotFound, ComponentConflict) as exc:
        raise ConfigError(f"algorithm.name: {exc}", path="algorithm.name") from None
    algo = config.algorithm
    algo.estimator = _merged(algo.estimator, preset.estimator, preset.estimator_config)
    algo.loss = _merged(algo.loss, preset.loss, preset.loss_config)
    if algo.aggregation is None:
        algo.aggregation = preset.aggregation


def _merged(user: ComponentSpec | None, name: str, options: Mapping[str, Any]) -> ComponentSpec:
    if user is None:
        return ComponentSpec(name=name, **dict(options))
    if user.name.rsplit(":", 1)[-1] != name:
        return user
    return ComponentSpec(name=user.name, **{**dict(options), **user.options})


def resolved_dict(config: RunConfig, components: Sequence[ResolvedComponent] = ()) -> dict[str, Any]:
    """The run config as plain data, with each component section expanded to its full validated
    options (defaults included)."""
    data = config.model_dump(mode="json")
    for component in components:
        if component.nested:
            continue
        full = {"name": component.name, **component.config.model_dump(mode="json")}
        _set_path(data, component.path, full)
    return data


def _set_path(data: dict[str, Any], path: str, full: dict[str, Any]) -> None:

    parts = [p for p in re.split(r"\.|\[(\d+)\]", path) if p]
    target: Any = data
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target[part]
    last = parts[-1]
    if path == "algorithm":
        return  # the algorithm section holds framework options, not the component's own
    if last.isdigit():
        extra = {k: v for k, v in target[int(last)].items() if k == "weight"}
        target[int(last)] = {**full, **extra}
    else:
        target[last] = full
