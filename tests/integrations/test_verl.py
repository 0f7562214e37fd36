"""agent_r1.integrations.verl against the real verl (0.9.1): registration, verl's own AgentLoopWorker
(hydra instantiation, per-sample post-processing, batch post-processing into a DataProto), masks
and token fidelity.

verl's rollout servers (vLLM/SGLang) need a GPU, so the worker's LLM server client is a stand-in:
:class:`HFServerManager` answers verl's ``generate(request_id, prompt_ids=..., sampling_params=...)``
with agent-r1's ``hf`` backend on a tiny model and returns verl's real ``TokenOutput``. Everything
else is verl's code."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

verl = pytest.importorskip("verl")

import numpy as np  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from agent_r1.contracts import SamplingParams  # noqa: E402
from agent_r1.integrations import IntegrationError  # noqa: E402
from agent_r1.mdp import TokenSource, Trajectory  # noqa: E402
from agent_r1.testing.models import save_tiny_model, tiny_tokenizer  # noqa: E402


class HFServerManager:
    """A stand-in for verl's LLMServerClient (no GPU here): the same ``generate`` signature, vLLM's
    sampling-parameter names, answered by agent-r1's ``hf`` backend. Records every call."""

    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from agent_r1.builtins.hf_backend import HFBackend

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        self.backend = HFBackend({}, model=model, tokenizer=tokenizer)
        self.calls: list[dict[str, Any]] = []

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ):
        from verl.workers.rollout.replica import TokenOutput

        sampling = SamplingParams(
            temperature=sampling_params["temperature"],
            top_p=sampling_params["top_p"],
            top_k=max(sampling_params["top_k"], 0),
            max_new_tokens=sampling_params["max_tokens"],
            stop=sampling_params.get("stop", []),
            seed=len(self.calls),
        )
        assert sampling_params.get("include_stop_str_in_output", True), "stop strings must stay in the ids"
        [generation] = self.backend.generate([prompt_ids], sampling)
        self.calls.append({"prompt_ids": list(prompt_ids), "token_ids": list(generation.token_ids)})
        return TokenOutput(
            token_ids=generation.token_ids,
            log_probs=generation.logprobs if sampling_params.get("logprobs") else None,
            stop_reason="completed",
        )


def verl_config(model_dir: Path, agent_loop_yaml: Path | None = None, **agent_r1: Any) -> Any:
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml")
    rollout = config.actor_rollout_ref.rollout
    config.actor_rollout_ref.model.path = str(model_dir)
    rollout.name = "vllm"
    rollout.prompt_length = 512
    rollout.response_length = 96
    rollout.calculate_log_probs = True
    if agent_loop_yaml is not None:
        rollout.agent.agent_loop_config_path = str(agent_loop_yaml)
    if agent_r1:
        OmegaConf.set_struct(config, False)
        config.agent_r1 = agent_r1
    return config


def batch_of(tasks: list, agent_name: str, repeat: int = 2) -> Any:
    from verl.protocol import DataProto

    rows = [task for task in tasks for _ in range(repeat)]
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt": np.array([task.messages for task in rows], dtype=object),
            "agent_name": np.array([agent_name] * len(rows), dtype=object),
            "index": np.array([i // repeat for i in range(len(rows))]),
            "extra_info": np.array(
                [{"task_id": task.id, "answer": task.answer} for task in rows], dtype=object
            ),
            "data_source": np.array(["arithmetic"] * len(rows), dtype=object),
        },
        meta_info={"global_steps": 1, "validate": False},
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("verl") / "model", arch="qwen2", seed=2)


def run_worker(config: Any, server: HFServerManager, batch: Any) -> Any:
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    worker = AgentLoopWorker(config, llm_client=server)
    return asyncio.run(worker.generate_sequences(batch))


def test_verl_worker_runs_the_loop_and_post_processes_it(model_dir: Path, calculator_tasks: list) -> None:
    import agent_r1.integrations.verl  # noqa: F401  registers "agent_r1"

    config = verl_config(
        model_dir,
        environment="calculator",
        env_options={"few_shot": 1},
        reward_shapers=[{"name": "answer_match", "options": {"mode": "numeric"}, "weight": 1.0}],
        max_turns=3,
        max_new_tokens=12,
    )
    server = HFServerManager(model_dir)
    out = run_worker(config, server, batch_of(calculator_tasks[:2], "agent_r1"))

    rows = len(out)
    assert rows == 4
    batch = out.batch
    assert batch["prompts"].shape == (rows, 512) and batch["responses"].shape == (rows, 96)
    # TensorDict answers `in` only through keys()
    assert "rm_scores" in batch.keys() and "rollout_log_probs" in batch.keys()  # noqa: SIM118
    for i in range(rows):
        trajectory = Trajectory.from_json_line(out.non_tensor_batch["agent_r1_trajectory"][i])
        attention = batch["attention_mask"][i].bool()
        tokens = batch["input_ids"][i][attention].tolist()
        assert tokens == trajectory.token_ids  # token fidelity: exactly the trajectory
        prompt_width = batch["prompts"].shape[1]
        response_attention = attention[prompt_width:]
        mask = batch["response_mask"][i][response_attention].tolist()
        assert mask == trajectory.loss_mask[trajectory.prompt_length :]
        sources = trajectory.sources[trajectory.prompt_length :]
        assert all(m == int(s is TokenSource.POLICY) for m, s in zip(mask, sources, strict=True))
        logprobs = batch["rollout_log_probs"][i][response_attention].tolist()
        assert logprobs == pytest.approx(trajectory.logprobs[trajectory.prompt_length :], abs=1e-6)
        assert float(batch["rm_scores"][i].sum()) == pytest.approx(trajectory.score)
        assert out.non_tensor_batch["__num_turns__"][i] >= 2
    # the policy tokens are exactly what the (stand-in) server returned, call by call
    sampled = [call["token_ids"] for call in server.calls]
    for i in range(rows):
        trajectory = Trajectory.from_json_line(out.non_tensor_batch["agent_r1_trajectory"][i])
        for segment in trajectory.segments:
            if segment.source is TokenSource.POLICY:
                assert segment.token_ids in sampled


def test_multi_turn_episode_masks_observations(model_dir: Path, calculator_tasks: list) -> None:
    """A scripted server (the right calculator call, then the answer) forces an observation between
    two actions: its tokens are in the response with mask 0, and the reward is agent-r1's."""
    import agent_r1.integrations.verl  # noqa: F401

    task = calculator_tasks[0]
    tokenizer = tiny_tokenizer()

    class ScriptedServer:
        def __init__(self) -> None:
            self.turn = 0

        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any):
            from verl.workers.rollout.replica import TokenOutput

            text = [
                f"<calc>{task.metadata['expression']}</calc>",
                f"<answer>{task.answer}</answer><|im_end|>",
            ][self.turn]
            self.turn += 1
            ids = tokenizer.encode(text, add_special_tokens=False)
            return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")

    config = verl_config(
        model_dir,
        environment="calculator",
        reward_shapers=[{"name": "answer_match", "options": {"mode": "numeric"}, "weight": 1.0}],
        max_turns=3,
    )
    out = run_worker(config, ScriptedServer(), batch_of([task], "agent_r1", repeat=1))
    trajectory = Trajectory.from_json_line(out.non_tensor_batch["agent_r1_trajectory"][0])
    assert trajectory.termination == "answer" and trajectory.score == 1.0
    assert TokenSource.ENV in trajectory.sources
    mask = out.batch["response_mask"][0].tolist()
    response = trajectory.sources[trajectory.prompt_length :]
    assert mask[: len(response)] == [int(s is TokenSource.POLICY) for s in response]
    assert 0 in mask[: len(response)]
    assert float(out.batch["rm_scores"][0].sum()) == 1.0
    assert out.non_tensor_batch["agent_r1_rewards"][0] == {"answer_match": 1.0}


def test_agent_loop_yaml_registration_and_options(
    model_dir: Path, tmp_path: Path, calculator_tasks: list
) -> None:
    yaml = tmp_path / "agent_loops.yaml"
    yaml.write_text(
        "- name: agent_r1_calculator\n"
        "  _target_: agent_r1.integrations.verl.AgentR1AgentLoop\n"
        "  environment: calculator\n"
        "  max_turns: 1\n"
        "  max_new_tokens: 8\n"
    )
    out = run_worker(
        verl_config(model_dir, agent_loop_yaml=yaml),
        HFServerManager(model_dir),
        batch_of(calculator_tasks[:1], "agent_r1_calculator", repeat=1),
    )
    trajectory = Trajectory.from_json_line(out.non_tensor_batch["agent_r1_trajectory"][0])
    assert trajectory.num_turns == 1 and trajectory.num_policy_tokens <= 8
    assert "rm_scores" not in out.batch.keys()  # noqa: SIM118  no shaper, no env reward: verl's reward manager scores it


def test_missing_environment_is_a_clear_error(model_dir: Path, calculator_tasks: list) -> None:
    from hydra.errors import InstantiationException

    import agent_r1.integrations.verl  # noqa: F401

    # verl builds loops with hydra, which wraps the error but keeps its message
    with pytest.raises(InstantiationException, match="needs an environment"):
        run_worker(
            verl_config(model_dir), HFServerManager(model_dir), batch_of(calculator_tasks[:1], "agent_r1", 1)
        )


def test_prompt_longer_than_prompt_length_is_refused(model_dir: Path, calculator_tasks: list) -> None:
    import agent_r1.integrations.verl  # noqa: F401

    config = verl_config(model_dir, environment="calculator", env_options={"few_shot": 1})
    config.actor_rollout_ref.rollout.prompt_length = 16
    with pytest.raises(IntegrationError, match="prompt_length=16"):
        run_worker(config, HFServerManager(model_dir), batch_of(calculator_tasks[:1], "agent_r1", 1))


def test_the_verl_plugins_entry_point_registers_the_loop() -> None:
    """A fresh interpreter: `import verl` alone loads agent-r1's verl.plugins entry point."""
    code = (
        "import verl\n"
        "from verl.experimental.agent_loop.agent_loop import _agent_loop_registry\n"
        "print(_agent_loop_registry['agent_r1'])\n"
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "agent_r1.integrations.verl.AgentR1AgentLoop" in result.stdout


def test_server_backend_reads_finish_reasons_off_the_tokens() -> None:
    """The backend adapter's finish reasons: end-of-turn token, stop string, budget."""
    from agent_r1.integrations.verl import VerlServerBackend

    tokenizer = tiny_tokenizer()
    replies = iter(
        [[5, 6, tokenizer.eos_token_id], tokenizer.encode("1+1</calc>", add_special_tokens=False), [7] * 8]
    )

    class Server:
        async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict, **_: Any):
            from verl.workers.rollout.replica import TokenOutput

            return TokenOutput(token_ids=next(replies), log_probs=None)

    async def main() -> list:
        loop = asyncio.get_running_loop()
        backend = VerlServerBackend(Server(), tokenizer, loop, request_id="r")
        sampling = SamplingParams(stop=["</calc>"], max_new_tokens=8)
        return await loop.run_in_executor(
            None, lambda: [backend.generate([[1, 2]], sampling)[0] for _ in range(3)]
        )

    eos, stop, length = asyncio.run(main())
    assert eos.finish_reason == "eos"
    assert stop.finish_reason == "stop" and stop.stop_sequence == "</calc>"
    assert length.finish_reason == "length" and length.logprobs == []
