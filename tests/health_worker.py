"""Worker of tests/test_health.py: a few training steps of the hackable toy run, judged by the
reward-hacking alarms on each process; writes each process's ``health/`` metrics per step.

Usage: python health_worker.py MODEL_DIR OUT_DIR STEPS (under torch.distributed.run or alone).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from health_helpers import AuditPlugin, hackable_run
from trainer_helpers import toy_registry

from agent_r1.config import RunConfig, validate_components
from agent_r1.engine.session import build_session
from agent_r1.engine.trainer import train_step


def main() -> None:
    model_dir, out, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    registry = toy_registry()
    registry.register_plugin(AuditPlugin(), "audits")
    run = RunConfig.model_validate(hackable_run(model_dir, out / "run", steps=steps))
    session = build_session(run, validate_components(run, registry), Path(run.output_dir), registry=registry)
    assert session.health is not None
    lines = []
    for _ in range(steps):
        metrics = train_step(session).metrics
        session.health.observe(session.step, metrics)
        lines.append({k: v for k, v in metrics.items() if k.startswith("health/")})
    (out / f"health.rank{session.rank}.json").write_text(json.dumps(lines), encoding="utf-8")
    session.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
