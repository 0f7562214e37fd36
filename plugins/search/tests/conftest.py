"""Fixtures of the search plugin's tests: a per-session index cache, a real retrieval server in a
subprocess, and a tiny real HTTP server that answers garbage."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest


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


@pytest.fixture(scope="session")
def search_server(search_cache: Path) -> Iterator[str]:
    """``agent-r1-search serve`` over the bundled HotpotQA corpus on a free port; yields its URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "agent_r1_plugin_search", "serve", "--corpus", "hotpotqa", "--port", "0"],
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
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


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
