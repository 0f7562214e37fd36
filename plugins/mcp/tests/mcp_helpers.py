"""Helpers of the MCP plugin's tests: the real notebook server (``notebook_server.py``, an
``MCPServer`` of the official SDK) as a stdio config section or as an HTTP server process on
127.0.0.1, and the tasks the tests roll out."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_r1 import Task

SERVER_SCRIPT = Path(__file__).with_name("notebook_server.py")


def stdio_server(name: str = "notes", **options: Any) -> dict[str, Any]:
    """The config section of the notebook server over stdio."""
    return {"name": name, "command": [sys.executable, str(SERVER_SCRIPT)], **options}


class HttpServer:
    """A notebook server process serving streamable HTTP on 127.0.0.1."""

    def __init__(self, log: Path) -> None:
        with socket.socket() as probe:  # a free port; the server binds it right after
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.log = log
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER_SCRIPT), "--http", str(self.port)], stdout=sink, stderr=sink
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the HTTP notebook server exited: {log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"the HTTP notebook server did not listen within 30 s: {log.read_text()}")

    def section(self, name: str = "notes", **options: Any) -> dict[str, Any]:
        """The config section of this server."""
        return {"name": name, "url": self.url, **options}

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)


def task(index: int = 0) -> Task:
    return Task(id=f"task{index}", messages=[{"role": "user", "content": f"Keep notes ({index})."}])
