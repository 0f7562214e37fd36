"""Sharded training (``trainer.sharding: fsdp2``) on CPU processes with gloo.

The same updates as one unsharded process: losses, gradient norms and final weights (GRPO with a
clipped gradient, PPO with a value head on the policy and KL in the loss over two mini-batches, a
separate critic model, LoRA, REINFORCE++ with batch-wide whitening) on 2 processes, sharded and with
DDP, and GRPO on 4 and on two "nodes" joined by a c10d rendezvous. Sabotage shows the tests can
fail: a gradient norm taken per shard changes the update, and a process left unsharded is refused on
every process instead of hanging. Checkpoints hold the unsharded state, so a run continues on
another number of processes (2 -> 1, 1 -> 2, and into an unsharded run) exactly. Every process holds
about 1/N of the parameters, gradients and AdamW state. End to end through the CLI, with real
rollouts from the gathered weights, a sharded run makes the same steps as a DDP run, survives
SIGKILL with --resume, and exports a model plain transformers loads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from trainer_helpers import (
    free_port,
    process_tree,
    torchrun,
    toy_config,
    write_config,
    write_tiny_checkpoint,
    write_toy_plugin,
)

WORKER = Path(__file__).with_name("sharding_worker.py")
TOLERANCE = {"rel": 1e-4, "abs": 1e-6}
WEIGHT_ATOL = 2e-5
pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _work(
    nproc: int, model_dir: Path, out: Path, scenario: str, mode: str, *extra: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the worker on ``nproc`` processes (0: plainly, without a launcher)."""
    args = [str(WORKER), str(model_dir), str(out), scenario, mode, *extra]
    command = [sys.executable, *args] if nproc == 0 else torchrun(nproc, *args)
    result = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def _result(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = torch.load(out / "result.pt", weights_only=False)
    return loaded


def _assert_same_training(expected: dict[str, Any], got: dict[str, Any]) -> None:
    assert len(expected["history"]) == len(got["history"]) > 0
    for want, have in zip(expected["history"], got["history"], strict=True):
        assert want.keys() == have.keys() == {"actor/pg_loss", "actor/grad_norm"}
        for key in want:
            assert have[key] == pytest.approx(want[key], **TOLERANCE), key
    for part in ("policy", "value_head"):
        if expected[part] is None:
            assert got[part] is None
            continue
        assert expected[part].keys() == got[part].keys()
        for name, tensor in expected[part].items():
            assert torch.allclose(tensor, got[part][name], atol=WEIGHT_ATOL), (part, name)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("sharding") / "model")


SCENARIOS = ("grpo", "ppo", "critic", "lora", "rpp", "uneven", "packed")
TWO_PROCESS_ARMS = [*(f"{s}:fsdp2" for s in SCENARIOS), "ppo:none", "rpp:none", "packed:none"]


@pytest.fixture(scope="module")
def single(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One unsharded process per scenario (one launch): the reference."""
    root = tmp_path_factory.mktemp("single")
    _work(0, model_dir, root, ",".join(f"{s}:none" for s in SCENARIOS), "none")
    return {s: _result(root / f"{s}-none") for s in SCENARIOS}


@pytest.fixture(scope="module")
def two(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every two-process arm, one launch."""
    root = tmp_path_factory.mktemp("two")
    _work(2, model_dir, root, ",".join(TWO_PROCESS_ARMS), "fsdp2")
    return root


@pytest.mark.parametrize("arm", TWO_PROCESS_ARMS)
def test_two_processes_train_like_one(arm: str, single: dict[str, dict[str, Any]], two: Path) -> None:
    """Sharded, and with DDP (``none``): loss normalisation and batch-level advantage statistics
    span every process, and the logged losses are the whole update's. ``uneven``: a process with
    fewer rows (fewer micro-batches) is padded with loss-free rows, so both run the same passes.
    ``packed``: with a token budget each process plans its own micro-batches; the one with fewer
    splits its costliest or runs loss-free passes (DDP: one row against four)."""
    scenario, _, mode = arm.partition(":")
    got = _result(two / f"{scenario}-{mode}")
    _assert_same_training(single[scenario], got)
    full = single[scenario]["bytes"]
    share = 0.55 if mode == "fsdp2" else 1.0
    assert got["bytes"]["parameters"] <= share * full["parameters"]
    assert got["bytes"]["optimizer"] <= share * full["optimizer"]


def test_four_processes_hold_a_quarter_and_train_like_one(
    model_dir: Path, single: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    _work(4, model_dir, tmp_path / "four", "grpo", "fsdp2")
    got = _result(tmp_path / "four")
    _assert_same_training(single["grpo"], got)
    full, mine = single["grpo"]["bytes"], got["bytes"]
    held = (mine["parameters"] + mine["optimizer"]) / (full["parameters"] + full["optimizer"])
    assert held <= 0.30, f"world 4 holds {held:.0%} of world 1's parameters and optimizer state"


def test_two_nodes_joined_by_a_rendezvous_train_like_one(
    model_dir: Path, single: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """``torchrun --nnodes 2`` twice on this machine (one process each), meeting at a c10d
    rendezvous on 127.0.0.1: what two machines would run."""
    port = free_port()
    args = [str(WORKER), str(model_dir), str(tmp_path / "nodes"), "grpo", "fsdp2"]
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}",
                "--rdzv_id=agent-r1-test",
                *args,
            ],
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]
    _assert_same_training(single["grpo"], _result(tmp_path / "nodes"))


def test_a_per_shard_gradient_norm_is_caught(
    model_dir: Path, single: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    _work(2, model_dir, tmp_path / "local", "grpo", "fsdp2", "--break", "local_norm")
    with pytest.raises(AssertionError):
        _assert_same_training(single["grpo"], _result(tmp_path / "local"))


def test_a_process_left_unsharded_is_refused_on_every_process(model_dir: Path, tmp_path: Path) -> None:
    result = _work(
        2, model_dir, tmp_path / "mixed", "grpo", "fsdp2", "--break", "unsharded_rank1", check=False
    )
    assert result.returncode != 0
    text = result.stdout + result.stderr
    assert "the processes sharded their models differently" in text
    assert "process 1: [('LlamaForCausalLM', False, 0)" in text


@pytest.fixture(scope="module")
def saved_by_two(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint state of two PPO steps on two sharded processes."""
    out = tmp_path_factory.mktemp("saved_by_two")
    _work(2, model_dir, out, "ppo", "fsdp2", "--save-after", "2")
    return out / "state.pt"


@pytest.mark.parametrize(
    ("saved_by", "resumed_by"), [(2, 1), (2, 0), (1, 2)], ids=["2-to-1", "2-to-unsharded", "1-to-2"]
)
def test_a_checkpoint_continues_on_another_number_of_processes(
    saved_by: int,
    resumed_by: int,
    model_dir: Path,
    single: dict[str, dict[str, Any]],
    saved_by_two: Path,
    tmp_path: Path,
) -> None:
    """Two PPO steps (value head, reference model, two mini-batches) on ``saved_by`` sharded
    processes, the checkpoint state written, then the third step on ``resumed_by`` processes (0: one
    process without sharding): the weights of the uninterrupted one-process run."""
    state = saved_by_two
    if saved_by != 2:
        _work(saved_by, model_dir, tmp_path / "first", "ppo", "fsdp2", "--save-after", "2")
        state = tmp_path / "first" / "state.pt"
    assert torch.load(state, weights_only=False)["optimizer_keys"] == "names"
    mode = "none" if resumed_by == 0 else "fsdp2"
    _work(resumed_by, model_dir, tmp_path / "second", "ppo", mode, "--resume", str(state))
    expected = dict(single["ppo"], history=single["ppo"]["history"][2:])
    _assert_same_training(expected, _result(tmp_path / "second"))


# --------------------------------------------------------------------------------------------
# End to end: `agent-r1 train` under torchrun, real rollouts
# --------------------------------------------------------------------------------------------

TIMING = ("time/", "perf/", "memory/")  # measurements of the machine, not results


def _train(config: Path, plugin: Path, *extra: str, delay: float = 0.0) -> subprocess.Popen[str]:
    env = {**_env(), "PYTHONPATH": str(plugin), "AGENT_R1_STRICT_PLUGINS": "1", "TOY_STEP_DELAY": str(delay)}
    command = torchrun(2, "-m", "agent_r1.cli", "train", str(config), *extra)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(process: subprocess.Popen[str]) -> None:
    output = process.communicate(timeout=600)[0]
    assert process.returncode == 0, output[-4000:]


def _metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)} for line in lines]


def _same_metrics(expected: list[dict[str, float]], got: list[dict[str, float]]) -> None:
    assert [m["step"] for m in got] == [m["step"] for m in expected]
    for want, have in zip(expected, got, strict=True):
        assert want.keys() == have.keys()
        for key, value in want.items():
            assert have[key] == pytest.approx(value, **TOLERANCE), (want["step"], key)


def test_sharded_cli_run_matches_ddp_survives_sigkill_and_exports(model_dir: Path, tmp_path: Path) -> None:
    plugin = write_toy_plugin(tmp_path / "plugin")

    def config(name: str, sharding: str) -> Path:
        trainer = {"steps": 3, "tasks_per_step": 2, "micro_batch_size": 2, "lr": 3e-3, "checkpoint_every": 1}
        raw = toy_config(model_dir, tmp_path / name, trainer={**trainer, "sharding": sharding})
        return write_config(tmp_path / f"{name}.yaml", raw)

    _finish(_train(config("ddp", "none"), plugin))
    _finish(_train(config("sharded", "fsdp2"), plugin))
    ddp, sharded = _metrics(tmp_path / "ddp"), _metrics(tmp_path / "sharded")
    assert len(sharded) == 3 and any(m["actor/grad_norm"] > 0 for m in sharded)
    _same_metrics(ddp, sharded)

    killed = config("killed", "fsdp2")
    victim = _train(killed, plugin, delay=0.5)
    checkpoints = tmp_path / "killed" / "checkpoints"
    deadline = time.monotonic() + 300
    while not (checkpoints.is_dir() and any(p.name == "step_000002" for p in checkpoints.iterdir())):
        assert victim.poll() is None, victim.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.05)
    for pid in process_tree(victim.pid):  # both workers and the launcher, at once
        os.kill(pid, signal.SIGKILL)
    victim.communicate(timeout=60)
    assert not (tmp_path / "killed" / "summary.json").exists(), "the run finished before it was killed"
    _finish(_train(killed, plugin, "--resume"))
    _same_metrics(sharded, _metrics(tmp_path / "killed"))

    from transformers import AutoModelForCausalLM

    prompt = torch.tensor([[5, 9, 13, 21, 7]])
    tokens = []
    for run in ("ddp", "sharded", "killed"):
        model = AutoModelForCausalLM.from_pretrained(tmp_path / run / "final", dtype=torch.float32)
        tokens.append(model.generate(prompt, max_new_tokens=8, do_sample=False)[0].tolist())
    assert tokens[0] == tokens[1] == tokens[2]
