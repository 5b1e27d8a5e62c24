"""Shared pieces of the simulated engine's process tests: a fake installed sglang, a simgpu state dir, Sim."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

LAB_DIR = Path(__file__).resolve().parents[1]
SIMGPU_DIR = LAB_DIR / "simgpu"
NINJA_STANDIN = LAB_DIR / "labctl" / "ninja_standin.py"
GPU_TOTAL = 81559
API_KEY = "sk-lab"
SPEC_INFO = """from enum import Enum, auto


class SpeculativeAlgorithm(Enum):
    DFLASH = auto()
    EAGLE = auto()
    EAGLE3 = auto()
    STANDALONE = auto()
    NGRAM = auto()
    NONE = auto()
"""
FAKE_SOURCES = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/speculative/__init__.py": "",
    "sglang/srt/speculative/spec_info.py": SPEC_INFO,
    "sglang/srt/speculative/spec_registry.py": '_RESERVED_ALIASES = frozenset({"NEXTN"})\n',
    "sglang/srt/utils/__init__.py": "",
    "sglang/srt/utils/common.py": "def is_cuda():\n    return True\n",
}
FAST = ["--sim-load-time", "0.3", "--sim-warmup-time", "0.1"]


# -- environment ----------------------------------------------------------------------------------------------------
def write_fake_sglang(site: Path) -> None:
    """An installed-looking sglang: sources plus a dist-info whose RECORD hashes them."""
    record = []
    for relative, text in FAKE_SOURCES.items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{relative},sha256={digest},{len(text)}")
    dist = site / "sglang-0.5.23.dist-info"
    dist.mkdir()
    (dist / "RECORD").write_text("\n".join([*record, "sglang-0.5.23.dist-info/RECORD,,"]) + "\n")
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")


def install_ninja(bin_dir: Path) -> None:
    """The venv's bin/ninja, as `lab up` installs it (the stand-in, run by this interpreter)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    ninja = bin_dir / "ninja"
    ninja.write_text(f"#!{sys.executable}\n" + NINJA_STANDIN.read_text())
    ninja.chmod(0o755)


@pytest.fixture
def lab_env(tmp_path) -> dict:
    return make_lab_env(tmp_path)


def make_lab_env(tmp_path: Path) -> dict:
    """The environment of a simulated server: fake sglang, simgpu state, the venv's ninja, a private JIT cache."""
    site = tmp_path / "site"
    write_fake_sglang(site)
    state = tmp_path / "simgpu"
    (state / "claims").mkdir(parents=True)
    (state / "gpus").write_text("".join(f"{i}\tGPU-{i:04d}-sim\t{GPU_TOTAL}\tNVIDIA H100 80GB HBM3\n" for i in (0, 1)))
    venv_bin = tmp_path / "venv-bin"
    install_ninja(venv_bin)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "SGL_", "CUDA_VISIBLE", "SIMGPU_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(LAB_DIR), str(site), str(SIMGPU_DIR)]),
        SIMGPU_STATE_DIR=str(state),
        PYTHONUNBUFFERED="1",
        PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
        SGLANG_JIT_CACHE_DIR=str(tmp_path / "jit-cache"),
        SIMGPU_RELEASE_LAG_MS="0",
        # A /health that generates takes a second or more; the tests that are about it turn it back on.
        SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION="false",
    )
    return env


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http(method: str, url: str, body=None, headers=None, timeout: float = 10):
    """(status, body bytes) of one request; HTTP errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


class Sim:
    """One simulator process (own session, so cleanup reaches every descendant, orphans included)."""

    def __init__(self, env: dict, argv: list[str]):
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sglang_sim.launch_server",
                "--model-path",
                "org/sim-model",
                "--port",
                str(self.port),
                *argv,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        # Read the log as it comes, so a chatty server never blocks on a full pipe.
        self._log: list[str] = []
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()

    def _read_log(self) -> None:
        for line in self.proc.stderr:
            self._log.append(line)

    @property
    def log(self) -> str:
        return "".join(self._log)

    def get(self, path: str, **kwargs):
        return http("GET", self.url + path, **kwargs)

    def post(self, path: str, body: dict, **kwargs):
        return http("POST", self.url + path, body, **kwargs)

    def wait_healthy(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sim exited {self.proc.returncode}:\n{self.log}"
            try:
                if self.get("/ready", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("sim never became healthy")

    def wait_listening(self, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"sim exited {self.proc.returncode}:\n{self.log}"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("sim never listened")

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode, self.log

    def children(self) -> dict[int, str]:
        """PID -> cmdline of this server's live processes (its process group) except the main process."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.proc.pid:
                continue
            try:
                stat = (entry / "stat").read_bytes()
                if os.getpgid(int(entry.name)) == self.proc.pid and stat[stat.rindex(b")") + 2 :][:1] not in b"ZX":
                    found[int(entry.name)] = (entry / "cmdline").read_bytes().decode()
            except (OSError, ProcessLookupError):
                continue
        return found

    def children_gone(self, timeout: float = 5.0) -> bool:
        """True once no process of this server but the main one is alive. SGLang's kill_process_tree sends SIGKILL
        and does not wait, so a child can still be exiting (its cmdline already empty) when the main process ended."""
        deadline = time.monotonic() + timeout
        while self.children():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self._reader.join(timeout=10)


@pytest.fixture
def start(lab_env):
    sims = []

    def launch(*argv: str, env: dict | None = None, healthy: bool = True) -> Sim:
        merged = {k: v for k, v in {**lab_env, **(env or {})}.items() if v is not None}  # None: unset it
        sim = Sim(merged, list(argv))
        sims.append(sim)
        if healthy:
            sim.wait_healthy()
        return sim

    yield launch
    for sim in sims:
        sim.kill()


def claims(env: dict) -> dict[str, int]:
    folder = Path(env["SIMGPU_STATE_DIR"]) / "claims"
    return {
        p.name: int(p.read_text().split()[0])
        for p in folder.iterdir()
        if p.name.startswith("gpu") and not p.name.endswith(".exit")
    }


def events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("\n\n")
    blocks = text[:-2].split("\n\n")
    assert all(block.startswith("data: ") for block in blocks)
    return [block[len("data: ") :] for block in blocks]


def generate(sim: Sim, tokens: int, timeout: float = 10, **fields):
    body = {"text": "Tell me about the lab.", "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    return sim.post("/generate", {**body, **fields}, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=timeout)


def held(env: dict) -> dict[str, int]:
    """Claims whose memory counts as used (the release lag of the env applies), by claim file name."""
    if str(SIMGPU_DIR) not in sys.path:
        sys.path.insert(0, str(SIMGPU_DIR))
    import simgpu_state

    state = Path(env["SIMGPU_STATE_DIR"])
    saved = os.environ.get("SIMGPU_RELEASE_LAG_MS")
    os.environ["SIMGPU_RELEASE_LAG_MS"] = env.get("SIMGPU_RELEASE_LAG_MS", "400")
    try:
        return {c.name: c.mib for c in simgpu_state.read_claims(state) if simgpu_state.claim_status(c, state)[0]}
    finally:
        if saved is None:
            os.environ.pop("SIMGPU_RELEASE_LAG_MS", None)
        else:
            os.environ["SIMGPU_RELEASE_LAG_MS"] = saved
