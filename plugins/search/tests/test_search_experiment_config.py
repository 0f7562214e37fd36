"""The paper's experiment config (``configs/agent_r1_multihop_qa.yaml``): its settings are the Agent-R1
/ Search-R1 multi-hop QA setup, and a dry run of it on CPU (a tiny model, the bundled samples in
place of the full QA files, the real retrieval server over the bundled corpus in place of E5 over
Wikipedia, one step of a few tasks) trains and evaluates in and out of domain through the same code
as ``agent-r1 train``. Only sizes, paths and the device change; every other setting is the file's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from agent_r1_plugin_search.corpus import bundled_path

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "agent_r1_multihop_qa.yaml"


def _paper_config() -> dict[str, Any]:
    return yaml.safe_load(CONFIG.read_text(encoding="utf-8"))


def test_the_config_is_the_papers_setup() -> None:
    config = _paper_config()
    assert Path(config["model"]["path"]).name == "Qwen2.5-3B-Instruct"
    assert config["algorithm"]["name"] == "grpo"
    assert config["algorithm"]["kl"] == {"coef": 0.001, "estimator": "k3", "placement": "loss"}
    assert [d["name"] for d in config["data"]["datasets"]] == ["hotpotqa", "2wikimultihopqa", "musique"]
    assert config["data"]["datasets"][2]["use_for"] == "eval"  # MuSiQue: out of domain, never trained on
    env = config["environment"]
    assert (env["layout"], env["topk"], env["max_turns"], env["retriever"]["kind"]) == (
        "search_r1",
        3,
        3,
        "http",
    )
    rollout, trainer = config["rollout"], config["trainer"]
    assert (rollout["group_size"], rollout["max_new_tokens"], trainer["tasks_per_step"]) == (5, 500, 512)
    assert (trainer["steps"], trainer["lr"]) == (1005, 1.0e-6)
    assert [r["name"] for r in config["rewards"] if r["weight"] > 0] == ["qa_em"]
    assert all(r["normalization"] == "official" for r in config["rewards"])


def _dry_run_config(tmp_path: Path, model_dir: Path, server: str) -> Path:
    config = _paper_config()
    samples = {name: str(bundled_path(name)) for name in ("hotpotqa", "2wikimultihopqa", "musique")}
    config["output_dir"] = str(tmp_path / "run")
    config["model"] = {**config["model"], "path": str(model_dir), "dtype": "float32", "device": "cpu"}
    config["model"]["gradient_checkpointing"] = False
    for dataset in config["data"]["datasets"]:
        dataset["path"] = samples[dataset["name"]]
        dataset.pop("eval_path", None)
        dataset["limit"] = 4
    config["environment"]["retriever"]["url"] = server
    config["environment"]["max_result_chars"] = 300
    config["rollout"].update(max_new_tokens=16, max_context=1536)
    config["trainer"].update(
        steps=1, tasks_per_step=2, micro_batch_size=5, warmup_steps=0, checkpoint_every=1
    )
    config["eval"].update(num_tasks=3, before_training=False)
    path = tmp_path / "dry_run.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_dry_run_on_cpu(searching_model: Path, search_server: str, tmp_path: Path) -> None:
    from agent_r1.run.training import prepare, train

    path = _dry_run_config(tmp_path, searching_model, search_server)
    prepare(path, ["algorithm.name=ppo"])  # the PPO variant validates too
    summary = train(path, [])
    assert summary["steps"] == 1
    run_dir = tmp_path / "run"
    (line,) = [json.loads(row) for row in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert "reward/qa_em" in line and "reward/qa_f1" in line
    after = json.loads((run_dir / "eval_after.json").read_text())
    text = json.dumps(after)
    for dataset in ("hotpotqa", "2wikimultihopqa", "musique"):  # one eval task from each, MuSiQue OOD
        assert dataset in text, dataset
    assert after["success_signal"] == "qa_em"
