"""Load-test ``agent-r1-search serve`` on 127.0.0.1: latency and server memory.

Runs the real server in a subprocess (BM25 over a corpus), then

1. one Search-R1-sized request: every query of a GRPO rollout batch at once (512 prompts x 5
   samples = 2,560 queries, ``topk`` 3, ``return_scores`` true), repeated ``--repeats`` times;
2. ``--clients`` concurrent clients, each sending ``--requests`` requests of ``--queries`` queries;

and prints wall-clock latencies (median, 95th percentile, max), throughput in queries per second, and
the server's resident memory (RSS, from ``/proc/<pid>/status``; Linux) before and after.
Bounded: every request has a timeout, and the counts are fixed by the options.

    python plugins/search/benchmarks/load_server.py                      # bundled hotpotqa corpus
    python plugins/search/benchmarks/load_server.py --synthetic 200000   # a larger synthetic corpus

``--synthetic N`` writes N passages made by recombining the sentences of the bundled Wikipedia
passages (deterministic), to see how latency and memory grow with the corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from agent_r1_plugin_search.corpus import bundled_path, read_passages
from agent_r1_plugin_search.datasets import LOADERS


def questions(count: int) -> list[str]:
    pool = [task.metadata["question"] for loader in LOADERS.values() for task in loader({}).load("all")]
    return [pool[i % len(pool)] for i in range(count)]


def synthetic_corpus(path: Path, size: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    passages = read_passages(bundled_path("wiki")) + read_passages(bundled_path("hotpotqa"))
    sentences = [s.strip() + "." for p in passages for s in p.text.split(".") if len(s.split()) > 3]
    titles = [p.title for p in passages]
    with path.open("w", encoding="utf-8") as handle:
        for i in range(size):
            text = " ".join(rng.choice(sentences) for _ in range(4))
            title = f"{rng.choice(titles)} ({i})"
            handle.write(json.dumps({"id": str(i), "contents": f'"{title}"\n{text}'}) + "\n")


def start_server(corpus: str, cache: str, batch_size: int) -> tuple[str, subprocess.Popen]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_r1_plugin_search",
            "serve",
            "--corpus",
            corpus,
            "--port",
            "0",
            "--batch-size",
            str(batch_size),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "AGENT_R1_SEARCH_CACHE": cache},
    )
    lines: queue.Queue = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in iter(process.stdout.readline, ""):
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while True:
        line = lines.get(timeout=900)
        if line is None:
            raise RuntimeError("server exited before serving")
        if "serving on " in line:
            return line.split("serving on ", 1)[1].strip(), process


def rss_bytes(pid: int) -> int:
    """Resident memory of a process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def summary(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    median = statistics.median(ordered)
    return f"median {median * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--corpus", default="hotpotqa")
    parser.add_argument("--synthetic", type=int, default=0, help="use a synthetic corpus of N passages")
    parser.add_argument("--big", type=int, default=2560, help="queries in the Search-R1-sized request")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        corpus = args.corpus
        if args.synthetic:
            corpus = str(Path(scratch) / "synthetic.jsonl")
            synthetic_corpus(Path(corpus), args.synthetic)
        started = time.perf_counter()
        url, process = start_server(corpus, str(Path(scratch) / "cache"), args.batch_size)
        try:
            print(
                f"corpus {args.synthetic or corpus}: server ready in {time.perf_counter() - started:.1f} s, "
                f"RSS {rss_bytes(process.pid) / 2**20:.0f} MiB"
            )
            endpoint = f"{url}/retrieve"
            big = questions(args.big)
            latencies = []
            peak = 0
            for _ in range(args.repeats):
                began = time.perf_counter()
                response = httpx.post(
                    endpoint, json={"queries": big, "topk": 3, "return_scores": True}, timeout=300
                )
                response.raise_for_status()
                latencies.append(time.perf_counter() - began)
                assert len(response.json()["result"]) == args.big
                peak = max(peak, rss_bytes(process.pid))
            print(
                f"{args.big} queries in one request x{args.repeats}: {summary(latencies)} "
                f"({args.big / statistics.median(latencies):.0f} queries/s); RSS after {peak / 2**20:.0f} MiB"
            )

            small = questions(args.clients * args.requests * args.queries)
            per_client = [small[i :: args.clients] for i in range(args.clients)]

            def client(mine: list[str]) -> list[float]:
                out = []
                with httpx.Client(timeout=120) as session:
                    for start in range(0, len(mine), args.queries):
                        began = time.perf_counter()
                        response = session.post(
                            endpoint, json={"queries": mine[start : start + args.queries]}
                        )
                        response.raise_for_status()
                        out.append(time.perf_counter() - began)
                return out

            began = time.perf_counter()
            with ThreadPoolExecutor(max_workers=args.clients) as pool:
                all_latencies = [x for result in pool.map(client, per_client) for x in result]
            wall = time.perf_counter() - began
            print(
                f"{args.clients} concurrent clients x {args.requests} requests x {args.queries} queries: "
                f"{summary(all_latencies)}; {len(small) / wall:.0f} queries/s overall; "
                f"RSS after {rss_bytes(process.pid) / 2**20:.0f} MiB"
            )
        finally:
            process.terminate()
            process.wait(timeout=30)


if __name__ == "__main__":
    main()
