"""A real `surge serve` in a subprocess (loopback, port 0), stopped at teardown with every
agent it started; and a local greedy reference run of the same store."""

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from surge.cli import serve_process
from tests.conftest import REPO


class Serve:
    """One `surge serve` process."""

    def __init__(
        self, proc: subprocess.Popen, info: dict, state_dir: Path, api_key: str | None = None
    ) -> None:
        self.proc, self.info, self.state_dir = proc, info, state_dir
        self.url = info["url"]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, timeout=120, headers=headers)
        self.agent_pids = [n["pid"] for n in self.http.get("/v1/nodes").json()["data"]]

    def metric(self, name: str, model: str | None = None) -> float:
        return self.read_metric(self.metrics_text(), name, model)

    def wait_ongoing(self, model: str, at_least: int, timeout_s: float = 60) -> None:
        """Wait until `model` counts `at_least` ongoing requests (they run)."""
        deadline = time.monotonic() + timeout_s
        while self.metric("surge_ongoing_requests", model) < at_least:
            assert time.monotonic() < deadline, "the requests never ran"
            time.sleep(0.1)

    def metrics_text(self) -> str:
        """One /metrics scrape (10-s bound: a poller must not wait out the client's 120 s)."""
        return self.http.get("/metrics", timeout=10).text

    @staticmethod
    def read_metric(text: str, name: str, model: str | None = None) -> float:
        """The sum of `name`'s samples in a scrape, for `model` if given."""
        total = 0.0
        for line in text.splitlines():
            named = line.startswith((name + "{", name + " "))
            if named and (model is None or f'model="{model}"' in line):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        self.http.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc.stdout:
            self.proc.stdout.close()
        for pid in self.agent_pids:  # the launcher stops its agents; make sure
            if pid and process_alive(pid):
                os.kill(pid, signal.SIGKILL)
                pytest.fail(f"agent {pid} outlived surge serve")


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of a dead parent is not alive
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def start_serve(tmp: Path, home: Path, config: dict, *args: str) -> Serve:
    cfg = tmp / "serve.yaml"
    cfg.write_text(yaml.safe_dump(config))
    state = tmp / "state"
    env = {**os.environ, "SURGE_HOME": str(home)}
    serve_args = ["--port", "0", "--config", str(cfg), "--state-dir", str(state), *args]
    proc, info = serve_process.start_serve(serve_args, tmp / "serve.log", env=env, cwd=REPO)
    key = args[args.index("--api-key") + 1] if "--api-key" in args else None
    return Serve(proc, info, state, key)


@pytest.fixture(scope="session")
def surge_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SURGE_HOME holding the default tiny store (made once, shared by every server)."""
    home = tmp_path_factory.mktemp("surge-home")
    old = os.environ.get("SURGE_HOME")
    os.environ["SURGE_HOME"] = str(home)
    try:
        from surge.model.default_store import default_store

        default_store()
    finally:
        if old is None:
            os.environ.pop("SURGE_HOME", None)
        else:
            os.environ["SURGE_HOME"] = old
    return home


@pytest.fixture(scope="session")
def tiny_store_dir(surge_home: Path) -> Path:
    return surge_home / "models" / "surge-tiny"


@pytest.fixture
def serve_factory(tmp_path: Path, surge_home: Path) -> Iterator[Callable[..., Serve]]:
    started: list[Serve] = []

    def make(config: dict, *args: str, sub: str = "a") -> Serve:
        d = tmp_path / sub
        d.mkdir(exist_ok=True)
        s = start_serve(d, surge_home, config, *args)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


class Reference:
    """Greedy texts of local engine runs of one store (the truth the cluster must match),
    cached per (prompt, max_tokens). `many` runs a whole burst's prompts as one batch (one
    step per token for all of them, not one per token per prompt)."""

    def __init__(self, store_dir: Path) -> None:
        from surge.config import EngineConfig
        from surge.engine.llm_engine import LLMEngine
        from surge.model.manifest import read_manifest
        from surge.model.tokenizer import load_tokenizer

        manifest = read_manifest(store_dir)
        self.tok = load_tokenizer(store_dir / manifest.tokenizer_file)
        self.engine = LLMEngine(manifest, EngineConfig(device="cpu"))
        self.cache: dict[tuple[str, int], str] = {}

    def __call__(self, prompt: str, max_tokens: int) -> str:
        return self.many([prompt], max_tokens)[0]

    def many(self, prompts: list[str], max_tokens: int) -> list[str]:
        from surge.engine.sampling import SamplingParams
        from tests.engine.reference import one_torch_thread

        todo = list(dict.fromkeys(p for p in prompts if (p, max_tokens) not in self.cache))
        if todo:
            # One torch thread (measured at load 13: 20 prompts x 100 tokens 125.7 s at 2
            # threads, 5.7 s at 1). The tokens are the same: the cluster, at torch's default
            # threads, must equal them token for token.
            with one_torch_thread():
                params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
                outs = self.engine.generate([self.tok.encode(p).ids for p in todo], params)
            for p, out in zip(todo, outs, strict=True):
                self.cache[(p, max_tokens)] = self.tok.decode(out.token_ids)
        return [self.cache[(p, max_tokens)] for p in prompts]


@pytest.fixture(scope="session")
def reference(tiny_store_dir: Path) -> Reference:
    """Greedy texts of local engine runs (see `Reference`)."""
    return Reference(tiny_store_dir)
