"""deploy/: the container recipes, the compose file, the Kubernetes manifests and the KubeRay
example parse, hold what the host tier and the token need, and every surge flag they use
is a real flag of the CLI. The image's entrypoint script runs here on its own, with a stub
`surge` that records what it would run. Linters run where installed (`.[deploy]`:
hadolint, kubernetes-validate; kubectl for kustomize) and skip, saying why, elsewhere."""

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
import yaml

from surge.cli.main import app
from tests.conftest import REPO

DEPLOY = REPO / "deploy"
ENTRYPOINT = DEPLOY / "docker" / "entrypoint.sh"


def cli_flags(*path: str) -> set[str]:
    """Every option of `surge PATH...` (e.g. "node", "run")."""
    cmd = typer.main.get_command(app)
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]  # a group
    return {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)}


def assert_real_flags(argv: list[str], *path: str) -> None:
    unknown = {a.split("=")[0] for a in argv if a.startswith("--")} - cli_flags(*path)
    assert not unknown, f"not flags of surge {' '.join(path)}: {sorted(unknown)}"


def tool(name: str) -> str | None:
    """A command of this venv (`.[deploy]` installs them), else one on PATH."""
    return shutil.which(name, path=f"{Path(sys.executable).parent}:{os.environ['PATH']}")


def run_entrypoint(tmp: Path, *args: str, **env: str) -> tuple[int, list[str], str]:
    """Run the entrypoint with a stub `surge` first on PATH: (exit code, the argv the stub got
    (without `surge`), stderr)."""
    stub_dir = tmp / "bin"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "surge"
    out = tmp / "argv.json"
    stub.write_text(
        f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open({str(out)!r}, 'w'))\n"
    )
    stub.chmod(0o755)
    out.unlink(missing_ok=True)
    full_env = {"PATH": f"{stub_dir}:/usr/bin:/bin", "HOME": str(tmp), **env}
    run = subprocess.run(
        ["sh", str(ENTRYPOINT), *args], env=full_env, capture_output=True, text=True, timeout=30
    )
    argv = json.loads(out.read_text()) if out.exists() else []
    return run.returncode, argv, run.stderr


@pytest.fixture
def tls_dir(tmp_path: Path) -> Path:
    d = tmp_path / "tls"
    d.mkdir()
    for name in ("ca.pem", "agent.pem", "agent.key", "controller.pem", "controller.key"):
        (d / name).write_text("x")
    return d


def test_entrypoint_runs_an_agent_with_its_ordinal_tls_and_token_file(tmp_path, tls_dir):
    code, argv, err = run_entrypoint(
        tmp_path, "agent", "--max-num-seqs", "8",
        POD_NAME="surge-agent-3", NODE_NAME="gpu-host-7", SURGE_TLS_DIR=str(tls_dir),
    )  # fmt: skip
    assert code == 0, err
    assert argv[:2] == ["node", "run"]
    assert_real_flags(argv[2:], "node", "run")
    opts = dict(itertools.pairwise(argv[2:]))
    assert opts["--node-id"] == "3" and opts["--host-group"] == "gpu-host-7"
    assert opts["--tls-cert"] == f"{tls_dir}/agent.pem" and opts["--tls-ca"] == f"{tls_dir}/ca.pem"
    assert opts["--token-file"] == "/etc/surge/token/token" and argv[-2:] == ["--max-num-seqs", "8"]


def test_entrypoint_runs_the_controller_on_the_static_launcher(tmp_path, tls_dir):
    code, argv, err = run_entrypoint(
        tmp_path, "controller", "--nodes", "2",
        SURGE_AGENTS="a-0.s:7070,a-1.s:7070", SURGE_TLS_DIR=str(tls_dir),
    )  # fmt: skip
    assert code == 0, err
    assert argv[0] == "serve"
    assert_real_flags(argv[1:], "serve")
    opts = dict(itertools.pairwise(argv[1:]))
    assert opts["--launcher"] == "static" and opts["--agents"] == "a-0.s:7070,a-1.s:7070"
    assert opts["--tls-key"] == f"{tls_dir}/controller.key"


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["agent"], {"SURGE_NODE_ID": "0"}, "error: no TLS files in"),
        (["agent"], {"POD_NAME": "agent", "SURGE_ALLOW_PLAIN": "1"}, "error: set SURGE_NODE_ID"),
        (["controller"], {"SURGE_ALLOW_PLAIN": "1"}, "error: set SURGE_AGENTS"),
        ([], {}, "error: give a role"),
    ],
)
def test_entrypoint_refuses_what_is_missing_with_one_line(tmp_path, args, env, message):
    code, argv, err = run_entrypoint(tmp_path, *args, SURGE_TLS_DIR=str(tmp_path / "none"), **env)
    assert code == 2 and argv == []
    assert err.strip().splitlines()[-1].startswith(message)


def test_entrypoint_without_tls_only_when_asked(tmp_path):
    code, argv, _ = run_entrypoint(tmp_path, "agent", SURGE_NODE_ID="1", SURGE_ALLOW_PLAIN="1")
    assert code == 0 and "--tls-cert" not in argv and argv[argv.index("--node-id") + 1] == "1"
    assert "--allow-plain" in argv
    assert_real_flags(argv[2:], "node", "run")


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda", "Dockerfile.ray"])
def test_dockerfiles_copy_what_exists_and_pass_hadolint(name):
    path = DEPLOY / "docker" / name
    lines = [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]
    for ln in lines:
        if ln.startswith("COPY "):
            *sources, _ = ln.split()[1:]
            assert all((REPO / s).exists() for s in sources), ln
    if name != "Dockerfile.ray":
        assert 'ENTRYPOINT ["tini", "--", "surge-entrypoint"]' in lines
    hadolint = tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install -e '.[deploy]')")
    run = subprocess.run([hadolint, str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr


def test_compose_runs_n_agents_with_room_in_dev_shm_and_the_token_as_a_secret():
    spec = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = spec["services"]
    agents = {n: s for n, s in services.items() if s["command"][0] == "agent"}
    ids = sorted(int(s["environment"]["SURGE_NODE_ID"]) for s in agents.values())
    assert ids == list(range(len(agents))) and len(agents) >= 2
    assert all(int(s["shm_size"].removesuffix("gb")) >= 1 for s in agents.values())
    ctl = services["controller"]
    listed = ctl["environment"]["SURGE_AGENTS"].split(",")
    assert sorted(listed) == sorted(f"{n}:7070" for n in agents)
    assert_real_flags(ctl["command"][1:], "serve")
    for s in services.values():
        assert s["secrets"] == ["surge_token"]
        assert s["environment"]["SURGE_TOKEN_FILE"] == "/run/secrets/surge_token"


def k8s_docs() -> list[dict]:
    kust = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    docs = []
    for res in kust["resources"]:
        docs += [d for d in yaml.safe_load_all((DEPLOY / "k8s" / res).read_text()) if d]
    return docs


def test_k8s_agents_statefulset_shm_secrets_and_the_controller_list_agree():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in k8s_docs()}
    sts = docs["StatefulSet", "surge-agent"]
    svc = docs["Service", sts["spec"]["serviceName"]]
    assert svc["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    pod = sts["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (agent,) = pod["containers"]
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    shm = volumes[mounts["/dev/shm"]]["emptyDir"]
    assert shm["medium"] == "Memory" and shm["sizeLimit"].endswith("Gi")
    assert volumes[mounts["/etc/surge/token"]]["secret"]["secretName"] == "surge-token"
    ctl = docs["Deployment", "surge-controller"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in ctl["env"]}
    replicas = sts["spec"]["replicas"]
    want = [f"surge-agent-{i}.{svc['metadata']['name']}:7070" for i in range(replicas)]
    assert env["SURGE_AGENTS"].split(",") == want
    args = ctl["args"]
    assert args[0] == "controller" and args[args.index("--nodes") + 1] == str(replicas)
    assert_real_flags(args[1:], "serve")
    assert_real_flags(agent["args"][1:], "node", "run")


def test_k8s_renders_with_kustomize_and_validates_against_the_schemas(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: the kustomize render is not checked")
    run = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s")], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert run.returncode == 0, run.stderr
    rendered = [d for d in yaml.safe_load_all(run.stdout) if d]
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == ["Deployment", "PersistentVolumeClaim", "Service", "Service", "StatefulSet"]
    assert all(d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "surge" for d in rendered)
    validate = tool("kubernetes-validate")
    if validate is None:
        pytest.skip("kubernetes-validate is not installed (pip install -e '.[deploy]')")
    out = tmp_path / "rendered.yaml"
    out.write_text(run.stdout)
    check = subprocess.run([validate, "--strict", str(out)], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count("passed") == len(rendered)


def test_raycluster_example_gives_each_gpu_worker_a_memory_backed_dev_shm():
    (rc,) = list(yaml.safe_load_all((DEPLOY / "ray" / "raycluster.yaml").read_text()))
    assert rc["kind"] == "RayCluster" and rc["apiVersion"] == "ray.io/v1"
    for group in rc["spec"]["workerGroupSpecs"]:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        (c,) = pod["containers"]
        shm = next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm")
        assert volumes[shm]["emptyDir"]["medium"] == "Memory"
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1
    cmd = re.search(r"#\s+(surge serve .*?)(?:\n#\s*\n|\n# The)", rc_text(), re.S)
    assert cmd is not None
    argv = cmd.group(1).replace("\\\n#", " ").split()
    assert_real_flags(argv[2:], "serve")


def rc_text() -> str:
    return (DEPLOY / "ray" / "raycluster.yaml").read_text()
