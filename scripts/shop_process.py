"""What the scripts that run a real `shop` share (fuzz_api.py, console_test.py): a free
port, waiting for `/readyz`, and a bearer-token file made by `shop auth hash-token`."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(base: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the shop exited with {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{base}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"the shop was not ready at {base}/readyz within {timeout:.0f} s")


def token_file(shop: Path, data: Path, tokens: list[tuple[str, str, str]]) -> Path:
    """Writes `data/tokens` with one line per (name, role, token), hashed by the shop itself."""
    lines = [subprocess.run([str(shop), "auth", "hash-token", name, role], input=token + "\n",
                            capture_output=True, text=True, check=True).stdout.strip()
             for name, role, token in tokens]
    path = data / "tokens"
    path.write_text("\n".join(lines) + "\n")
    return path
