"""The command line of ``benchmarks/bench.py``: the options, the sections run one after the other
(a section's failure is reported and the others go on; the report is rewritten after each), and
``bench.py arm SPEC.json OUT.json``, one agent-r1 arm in this process (what the ``trl`` section
starts in a subprocess)."""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import benchsuite
from benchsuite import DEFAULT_TRL_PYTHON, SECTIONS
from benchsuite.arm import library_versions, run_agent_r1_arm
from benchsuite.models import prepare_models
from benchsuite.results import jsonable, machine, merge_results, write_reports
from benchsuite.scaling_section import run_scaling_section
from benchsuite.tools_section import run_tools_section
from benchsuite.trl_section import run_trl_section, summarise_case


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(benchsuite.__doc__ or "").splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated sections ({', '.join(SECTIONS)})"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, a few seconds per section: checks that it runs"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results"), help="where bench.json/.md/.png go"
    )
    parser.add_argument("--work", type=Path, default=Path("runs/bench"), help="models, arm outputs, logs")
    parser.add_argument(
        "--models",
        default="tiny,smollm2",
        help="models of the trl section (tiny, smollm2); tiny includes tiny-tools",
    )
    parser.add_argument(
        "--cases", default="", help="only these cases of the trl section (comma-separated names)"
    )
    parser.add_argument("--scaling-models", default="tiny,smollm2", help="models of the scaling section")
    parser.add_argument(
        "--trl-python",
        default=DEFAULT_TRL_PYTHON,
        help="interpreter with trl (both arms of the trl section run with it)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (default 1)")
    parser.add_argument(
        "--update",
        action="store_true",
        help="merge into --out's bench.json: the cases and sections run now replace their old figures",
    )
    parser.add_argument(
        "--from-json", type=Path, help="only rewrite bench.md and the plots from this bench.json (no runs)"
    )
    parser.add_argument(
        "--arm-timeout", type=float, default=1800.0, help="seconds before an arm process is stopped"
    )
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.scaling_models = [m.strip() for m in args.scaling_models.split(",") if m.strip()]
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    for name in [*args.models, *args.scaling_models]:
        if name not in ("tiny", "smollm2"):
            parser.error(f"unknown model {name!r}: choose tiny or smollm2")
    if args.smoke:
        args.models = ["tiny"]
        args.scaling_models = ["tiny"]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sections ``argv`` asks for (``sys.argv`` when ``None``) and write the report; the
    exit status is 1 when something failed (the report says what)."""
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "arm":
        return arm_main(sys.argv[2:])
    args = parse_args(argv)
    if args.from_json:
        return rewrite_report(args.from_json, args.out)
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    args.work = args.work.resolve()
    previous = None
    if args.update:
        existing = args.out / "bench.json"
        if not existing.is_file():
            print(f"error: --update: {existing} does not exist; run without --update first", file=sys.stderr)
            return 2
        previous = json.loads(existing.read_text(encoding="utf-8"))
    started = time.perf_counter()
    results = new_results(args, argv)
    models = prepare_models(args.work, sorted(model_names(args)), smoke=args.smoke)
    results["models"] = {
        k: {kk: vv for kk, vv in v.items() if kk != "tools_template"} for k, v in models.items()
    }
    for section in args.only:
        print(f"== section {section}", flush=True)
        run_section(section, args, models, results)
        results["wall_s"] = time.perf_counter() - started
        report = merge_results(previous, results) if previous is not None else results
        write_reports(report, args.out)  # after every section: a crash later loses nothing
    print((args.out / "bench.md").read_text(encoding="utf-8"))
    plots = report.get("plots", []) if args.only else []
    print(f"written: {args.out / 'bench.md'}, {args.out / 'bench.json'}, {', '.join(plots)}")
    return 1 if results["failures"] else 0


def rewrite_report(source: Path, out: Path) -> int:
    """``--from-json``: rewrite ``bench.md`` and the plots from a ``bench.json`` (no runs)."""
    results = json.loads(source.read_text(encoding="utf-8"))
    for case in results.get("trl", {}).get("cases", []):
        case["summary"] = summarise_case(case["runs"])
    write_reports(results, out)
    print(f"written: {out / 'bench.md'}, {out / 'bench.json'}, {', '.join(results['plots'])}")
    return 0


def new_results(args: argparse.Namespace, argv: Sequence[str] | None) -> dict[str, Any]:
    """The report of this run before any section ran: how it was started, on what."""
    return {
        "command": " ".join(["benchmarks/bench.py", *(argv if argv is not None else sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "versions": library_versions(),
        "threads": args.threads,
        "smoke": args.smoke,
        "sections": args.only,
        "failures": [],
    }


def model_names(args: argparse.Namespace) -> set[str]:
    """The models the sections to run need (``tiny-tools``: the tool task of the full ``trl`` run)."""
    names: set[str] = set()
    if "trl" in args.only:
        if "tiny" in args.models:
            names |= {"tiny"} if args.smoke else {"tiny", "tiny-tools"}
        if "smollm2" in args.models:
            names.add("smollm2")
    if "scaling" in args.only:
        names |= set(args.scaling_models)
    return names


def run_section(
    section: str, args: argparse.Namespace, models: dict[str, dict[str, Any]], results: dict[str, Any]
) -> None:
    """Run one section into ``results``, its failed runs (or its own failure) into
    ``results["failures"]``."""
    failures = results["failures"]
    try:
        if section == "trl":
            if not Path(args.trl_python).exists():
                results["trl"] = {
                    "skipped": f"no interpreter at {args.trl_python}: run `make venv-integrations` "
                    "(trl 1.16) or pass --trl-python"
                }
                failures.append(f"trl: {results['trl']['skipped']}")
            else:
                results["trl"] = run_trl_section(args, models)
                for case in results["trl"]["cases"]:
                    failures += [
                        f"trl/{case['case']}: {run['error']}" for run in case["runs"] if "error" in run
                    ]
        elif section == "tools":
            results["tools"] = run_tools_section(args)
        elif section == "scaling":
            results["scaling"] = run_scaling_section(args, models)
            for name, model in results["scaling"]["models"].items():
                failures += [
                    f"scaling/{name} {p['axis']}={p['value']}: {p['error']}"
                    for p in model["points"]
                    if "error" in p
                ]
    except Exception as exc:  # a section's failure is reported; the other sections go on
        traceback.print_exc()
        failures.append(f"{section}: {type(exc).__name__}: {exc}")


def arm_main(argv: Sequence[str]) -> int:
    """``bench.py arm SPEC.json OUT.json``: one agent-r1 arm, in this process."""
    if len(argv) != 2:
        print("error: usage: bench.py arm SPEC.json OUT.json", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    result = run_agent_r1_arm(spec)
    Path(argv[1]).write_text(json.dumps(jsonable(result), indent=1), encoding="utf-8")
    return 0
