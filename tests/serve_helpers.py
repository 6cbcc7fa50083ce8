"""Run `nmt serve` in a subprocess and talk to it over HTTP; drive its page in Chromium.

Shared by the tests and by bench/bench_serve.py.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

from conftest import start_nmt

START_TIMEOUT = 180.0  # seconds: the model loads in a subprocess on a shared 2-core machine


class Server:
    """`nmt serve -r RUN --port 0 ...` in a subprocess; its port is read from its first stderr line."""

    def __init__(self, run_dir: Path, *args: str, log_dir: Optional[Path] = None, env: Optional[dict[str, str]] = None):
        fd, name = tempfile.mkstemp(prefix="nmt-serve-", suffix=".log", dir=log_dir)
        os.close(fd)
        self.log = Path(name)
        self._log_file = open(self.log, "wb")
        self.proc = start_nmt("serve", "-r", run_dir, "--port", "0", *args, stdin=subprocess.DEVNULL, stdout=self._log_file,
                              stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_TIMEOUT
        self.port = 0
        while time.monotonic() < deadline:
            found = re.search(r"on http://127\.0\.0\.1:(\d+)", self.log.read_text(errors="replace"))
            if found:
                self.port = int(found.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"nmt serve exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.1)
        if not self.port:
            self.stop()
            raise RuntimeError(f"nmt serve did not start within {START_TIMEOUT:.0f} s:\n{self.output()}")
        self.url = f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def request(self, method: str, path: str, body: Optional[bytes] = None,
                headers: Optional[dict[str, str]] = None, timeout: float = 120.0) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            conn.close()

    def post(self, payload: Any, timeout: float = 120.0) -> tuple[int, Any]:
        status, _, body = self.request("POST", "/translate", json.dumps(payload).encode(),
                                       {"Content-Type": "application/json"}, timeout)
        return status, json.loads(body)

    def get(self, path: str) -> Any:
        status, _, body = self.request("GET", path)
        assert status == 200, body
        return json.loads(body)

    def wait_for_stats(self, until: Callable[[dict[str, Any]], bool], timeout: float = 120.0) -> dict[str, Any]:
        """Poll /info until its batching counters satisfy `until` (a state the server reports,
        not a time); those counters."""
        deadline = time.monotonic() + timeout
        while not until(stats := self.get("/info")["stats"]):
            assert time.monotonic() < deadline, f"/info never showed the state waited for; last {stats}"
            time.sleep(0.01)
        return stats

    def terminate(self, timeout: float = 120.0) -> int:
        """SIGTERM, then the exit status (killed and -9 when it does not exit in time)."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return -9

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log_file.close()


# -- the page in headless Chromium --------------------------------------------------------

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


def find_or_install_chromium() -> tuple[Optional[str], str]:
    """(path of Debian's chromium, "") or (None, why it cannot be had); installs it with apt-get when root."""
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path, ""
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        return None, "chromium is not installed and apt-get (as root) is not available to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            return None, f"`{' '.join(cmd)}` failed: {tail[0]}"
    path = shutil.which("chromium")
    return (path, "") if path else (None, "apt-get installed chromium but it is not on PATH")


def translate_in_page(url: str, text: str, chromium: str, screenshot: Optional[Path] = None,
                      timeout_ms: float = 120_000) -> dict[str, str]:
    """Open the page, type `text` into the box, click Translate, and read what the page shows.

    Returns {"output", "time", "model"}: the translation shown, the time taken, the model line.
    """
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="nmt-chromium-") as profile, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            profile, executable_path=chromium, headless=True, args=CHROMIUM_FLAGS, timeout=timeout_ms)
        try:
            page = browser.new_page()
            page.set_default_timeout(timeout_ms)
            page.goto(url)
            page.wait_for_function("document.getElementById('model').textContent.includes('→')")
            page.click("#source")
            page.keyboard.type(text)
            page.click("#translate")
            page.wait_for_function("document.getElementById('time').textContent.includes(' ms')")
            shown = {"output": page.inner_text("#output"), "time": page.inner_text("#time"),
                     "model": page.inner_text("#model")}
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
            return shown
        finally:
            browser.close()
