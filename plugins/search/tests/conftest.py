"""Fixtures of the search plugin's tests: a per-session index cache, a real retrieval server in a
subprocess, a tiny real HTTP server that answers garbage, and a tiny model that searches."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agent_r1.testing.pytest_plugin import agent_r1_rollout_recorder  # noqa: F401 - a fixture


@pytest.fixture(scope="session", autouse=True)
def search_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One index cache for the session; also the default cache of every retriever built by tests."""
    path = tmp_path_factory.mktemp("search-cache")
    previous = os.environ.get("AGENT_R1_SEARCH_CACHE")
    os.environ["AGENT_R1_SEARCH_CACHE"] = str(path)
    yield path
    if previous is None:
        os.environ.pop("AGENT_R1_SEARCH_CACHE", None)
    else:
        os.environ["AGENT_R1_SEARCH_CACHE"] = previous


@pytest.fixture(scope="session")
def hotpot_bm25(search_cache: Path):
    from agent_r1_plugin_search.retrievers import BM25Retriever

    return BM25Retriever.from_corpus("hotpotqa", cache_dir=search_cache)


def _read_lines(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        lines.put(line)
    lines.put(None)


@contextmanager
def serving(search_cache: Path, *args: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """``agent-r1-search serve --port 0 ARGS`` in a subprocess; yields its URL and the process."""
    process = subprocess.Popen(
        [sys.executable, "-m", "agent_r1_plugin_search", "serve", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "AGENT_R1_SEARCH_CACHE": str(search_cache)},
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stdout, lines), daemon=True).start()
    seen = []
    url = None
    try:
        while url is None:
            line = lines.get(timeout=60)
            if line is None:
                raise RuntimeError("retrieval server exited before serving:\n" + "".join(seen))
            seen.append(line)
            if "serving on " in line:
                url = line.split("serving on ", 1)[1].strip()
        yield url, process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="session")
def serve_search() -> object:
    """:func:`serving`, for tests that start a server with options of their own."""
    return serving


@pytest.fixture(scope="session")
def search_server(search_cache: Path) -> Iterator[str]:
    """``agent-r1-search serve`` over the bundled HotpotQA corpus on a free port; yields its URL."""
    with serving(search_cache, "--corpus", "hotpotqa") as (url, _):
        yield url


class _GarbageHandler(BaseHTTPRequestHandler):
    """Answers ``POST /<mode>/retrieve`` with the broken reply named by ``mode``."""

    calls: dict[str, int] = {}

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:
        mode = self.path.strip("/").split("/")[0]
        type(self).calls[mode] = type(self).calls.get(mode, 0) + 1
        length = int(self.headers.get("Content-Length", 0))
        request = json.loads(self.rfile.read(length) or b"{}")
        n = len(request.get("queries", []))
        document = {"id": "1", "contents": '"T"\nx'}
        replies = {
            "notjson": (200, b"<html>surprise</html>"),
            "noresult": (200, json.dumps({"answer": []}).encode()),
            "short": (200, json.dumps({"result": []}).encode()),
            "badhit": (200, json.dumps({"result": [[{"document": {"id": "1"}, "score": 1}]] * n}).encode()),
            "badscore": (
                200,
                json.dumps({"result": [[{"document": document, "score": "high"}]] * n}).encode(),
            ),
            "error500": (500, b"internal error"),
            "error400": (400, json.dumps({"error": "you sent nonsense"}).encode()),
        }
        status, body = replies.get(mode, (404, b"unknown mode"))
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="session")
def garbage_server() -> Iterator[tuple[str, dict[str, int]]]:
    """A real HTTP server on 127.0.0.1 that breaks the protocol in the way the path names."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _GarbageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _GarbageHandler.calls
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def searching_model(tmp_path_factory: pytest.TempPathFactory, search_cache: Path) -> Path:
    """A tiny model directory (``model.path``) whose policy opens its reply with a search.

    A random tiny model (``agent_r1.testing.models``) never writes ``<search>...</search>``, so its
    rollouts would never reach the search tool. This one is that random model after a few dozen
    supervised steps on ``<search>`` + the question's first three words + ``</search>``, given the
    end of the real ``search_qa`` prompt (tags format) of HotpotQA and NQ training questions. Sampled
    at temperature 1 it writes a well-formed search about half the time, garbled tags otherwise; it
    has learned the format only, never an answer.
    """
    import asyncio
    import random
    import re

    import torch

    from agent_r1.rollout.chat import ChatRenderer
    from agent_r1.testing.models import completion_sft_step, save_tiny_model, tiny_model, tiny_tokenizer
    from agent_r1_plugin_search.datasets import HotpotQADataset, NQDataset
    from agent_r1_plugin_search.env import SearchQAEnv

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, tie_word_embeddings=False, seed=0)
    renderer = ChatRenderer(tokenizer)
    env = SearchQAEnv({"format": "tags", "retriever": {"kind": "bm25", "corpus": "hotpotqa"}})
    examples = []
    for task in HotpotQADataset({"limit": 32}).load("train") + NQDataset({"limit": 8}).load("train"):
        start = asyncio.run(env.reset(task))
        prompt = renderer.render_prompt(start.messages, start.tools)[-24:]
        query = " ".join(re.findall(r"\w+", task.metadata["question"])[:3])
        examples.append((prompt, renderer.encode(f"<search>{query}</search>")))
    rng = random.Random(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(50):
        batch = rng.sample(examples, 16)
        completion_sft_step(model, optimizer, batch, tokenizer.pad_token_id)
    return save_tiny_model(tmp_path_factory.mktemp("searching-model"), model.eval(), tokenizer)
