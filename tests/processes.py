"""Running real processes in tests: free ports, waiting until one answers, stopping it."""

from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(
    url: str, timeout_s: float = 20.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    """Wait until `url` answers 2xx, or fail (with the process's fate if it died)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was up")
        try:
            if httpx.get(url, timeout=1.0).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not come up in {timeout_s} s")


def stop_process(proc: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
