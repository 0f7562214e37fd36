"""Small file systems for the "disk full" and "read-only" tests.

As root on Linux, :func:`small_tmpfs` mounts a real size-limited tmpfs (writes past its size fail
with ``ENOSPC``, exactly as on a full disk), or a read-only one. Where mounting is not possible
(not root, a container without the capability, another OS), tests fall back to
:func:`file_size_limit`: ``RLIMIT_FSIZE`` in the child process makes any write past the limit fail
with ``EFBIG`` ("File too large"), which agent-r1 reports as disk full too. That is a simulation
of a full disk, not the real thing, and the tests that use it say so.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root on Linux, with the capability)."""
    return sys.platform.startswith("linux") and os.geteuid() == 0


@contextlib.contextmanager
def small_tmpfs(parent: Path, *, size: str = "1m", read_only: bool = False) -> Iterator[Path | None]:
    """Mount a tmpfs of ``size`` under ``parent`` and yield its path (unmounted afterwards), or
    yield ``None`` when mounting is not possible here."""
    if not can_mount():
        yield None
        return
    mount_point = parent / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir(parents=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        mount_point.rmdir()
        yield None
        return
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], capture_output=True, check=False)
        mount_point.rmdir()


def file_size_limit(limit_bytes: int) -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess``: writes past ``limit_bytes`` in one file fail with
    ``EFBIG`` (SIGXFSZ is ignored so that the write returns the error instead of killing)."""

    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply
