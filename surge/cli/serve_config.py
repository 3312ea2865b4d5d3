"""`surge serve`'s settings: the config file (YAML or TOML) read and every key checked, and
the per-node lists it may hold. What flows: a path -> a dict of settings the `serve` command
merges its flags into (flags win). Owned by the CLI.
"""

import hashlib
import os
import shutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from surge.cli.log_level import log_level
from surge.cli.outputs import make_writable_dir
from surge.control.settings import ControllerConfig
from surge.errors import SurgeError
from surge.policy.nodes.machine_fit import ClusterAsk, MachineFacts, machine_problems
from surge.policy.systems import SYSTEMS, serve_system

SERVE_KEYS = {
    "nodes": int,
    "link_gbps": float,
    "host": str,
    "port": int,
    "api_key": str,
    "state_dir": str,
    "slots_per_node": int,
    "egress_gbps": list,
    "ingress_gbps": list,
    "host_groups": list,
    "max_num_seqs": int,
    "fuse_projections": bool,
    "compile_decode": bool,
    "compile_quiet_s": float,
    "compile_defer_max_s": float,
    "host_cache_gb": float,
    "tick_s": float,
    "log_level": str,
    "strategy": str,
    "deployments": list,
    "max_body_mb": float,
    "emulate": str,
    "time_dilation": float,
    "allow_overcommit": bool,
    "agents": list,
    "agents_timeout_s": float,
    "token_file": str,
    "tls_cert": str,
    "tls_key": str,
    "tls_ca": str,
    "ray_placement": str,
    "ray_gpus_per_agent": float,
    "allow_plain": bool,
    "stall_timeout_s": float,
    "profile_engine": bool,
    "profile_dir": str,
}
"""Settings a config file may hold, and their types."""
SERVE_STRATEGIES = tuple(n for n, s in SYSTEMS.items() if s.serve)
"""The `surge.policy.systems` entries `surge serve` carries out (a deployment's strategy)."""


def load_config(path: Path) -> dict[str, Any]:
    """Read a YAML (.yaml/.yml) or TOML (.toml) config file; every key is checked."""
    if not path.exists():
        raise SurgeError(f"config file {path} does not exist")
    if not path.is_file():
        raise SurgeError(f"config file {path} is not a regular file; give a .yaml or .toml file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SurgeError(f"config file {path} cannot be read as text: {e}") from None
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
        else:
            raise SurgeError(f"config file {path} must end in .yaml, .yml or .toml")
    except (tomllib.TOMLDecodeError, ValueError) as e:
        raise SurgeError(f"config file {path} is not valid: {str(e).splitlines()[0]}") from None
    except Exception as e:  # yaml.YAMLError and friends
        if isinstance(e, SurgeError):
            raise
        raise SurgeError(f"config file {path} is not valid: {str(e).splitlines()[0]}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SurgeError(f"config file {path} must hold a mapping of settings")
    for key, value in data.items():
        if key not in SERVE_KEYS:
            raise SurgeError(
                f"config file {path}: unknown setting {key!r}; known: {', '.join(SERVE_KEYS)}"
            )
        want = SERVE_KEYS[key]
        ok = isinstance(value, want) and not isinstance(value, bool)
        if want is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if want is bool:
            ok = isinstance(value, bool)
        if not ok:
            raise SurgeError(f"config file {path}: {key} must be a {want.__name__}")
    if "log_level" in data:
        log_level(data["log_level"], f"config file {path}: log_level")
    if "strategy" in data:
        try:
            serve_system(data["strategy"])
        except SurgeError as e:
            raise SurgeError(f"config file {path}: {e}") from None
    from surge.control.spec import new_deployment

    for d in data.get("deployments", []):
        try:  # its chat template compiled too: a bad one is this line, not a 400 per chat
            new_deployment(d)
        except SurgeError as e:
            raise SurgeError(f"config file {path}: deployment: {e}") from None
    return data


def per_node_numbers(cfg: dict[str, Any], key: str) -> tuple[float, ...] | None:
    """A config list of per-node numbers (`egress_gbps`, `ingress_gbps`), or None."""
    v = cfg.get(key)
    if v is None:
        return None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v):
        raise SurgeError(f"{key} must be a list of numbers, one per node (got {v!r})")
    return tuple(float(x) for x in v)


def host_groups(cfg: dict[str, Any]) -> list[tuple[int, ...]]:
    """The config's `host_groups`: lists of node ids."""
    out = []
    for g in cfg.get("host_groups", []):
        if not isinstance(g, list) or not all(type(x) is int for x in g):
            raise SurgeError(f"host_groups must be lists of node ids like [[0, 1]] (got {g!r})")
        out.append(tuple(g))
    return out


def default_state_dir() -> Path:
    """`$SURGE_HOME/serve/<clone>-<hash>`: one state directory per copy of surge (its source
    checkout or its environment's install), so two clones' `surge serve` never pick up each
    other's deployments (issue 36: all clones shared `~/.cache/surge/serve`)."""
    from surge.model.default_store import surge_home

    clone = Path(__file__).resolve().parent.parent.parent
    digest = hashlib.sha256(str(clone).encode()).hexdigest()[:8]
    return surge_home() / "serve" / f"{clone.name}-{digest}"


def state_dir_path(value: str | None) -> Path:
    """The state directory to use (`--state-dir`, the config's `state_dir`, else the default
    above); nothing is made yet (`make_state_dir` does, once the port is ours)."""
    return Path(value).expanduser().resolve() if value else default_state_dir()


def step_profile_dir(cfg: dict[str, Any]) -> Path | None:
    """Where deployments' engine step profiles are kept (`ControllerConfig.step_profile_dir`:
    the config's `profile_dir`, else `$SURGE_HOME/profiles`), or None: not profiled, when
    the config says `profile_engine: false`, when the agents run elsewhere (launcher ray or
    static: this machine's device is not theirs), in network namespaces under CPU quotas,
    or emulated (its own cost model)."""
    if (
        not cfg.get("profile_engine", True)
        or cfg.get("launcher", "local") != "local"
        or cfg.get("cluster", "loopback") != "loopback"
        or cfg.get("emulation") is not None
    ):
        return None
    from surge.runtime.step_profiles import default_profile_dir

    value = cfg.get("profile_dir")
    return Path(value).expanduser().resolve() if value else default_profile_dir()


def make_state_dir(path: Path) -> None:
    """Create the state directory and check it is writable, or one `SurgeError` line."""
    make_writable_dir(path, "--state-dir")


CONTROLLER_FIELDS: dict[str, Callable[[Any], Any]] = {
    "link_gbps": float,
    "slots_per_node": int,
    "max_num_seqs": int,
    "fuse_projections": bool,
    "compile_decode": bool,
    "compile_quiet_s": float,
    "compile_defer_max_s": float,
    "tick_s": float,
    "launcher": str,
    "ray_address": str,
    "cluster": str,
    "agent_host": str,
    "stall_timeout_s": float,
}
"""Config-file keys (and flags) that fill `ControllerConfig` fields of the same name, each
with its conversion; a key absent or null keeps the field's default."""


def controller_config(cfg: dict[str, Any], num_nodes: int) -> ControllerConfig:
    """The control plane's settings from `serve`'s merged flags and config file, validated
    (per-node caps, host groups: `ControllerConfig.__post_init__`) before anything binds or
    starts, so a bad one is one `error:` line."""
    # Only the settings the user gave: every default lives in `ControllerConfig` alone.
    given = {k: conv(cfg[k]) for k, conv in CONTROLLER_FIELDS.items() if cfg.get(k) is not None}
    if cfg.get("host_cache_gb") is not None:
        given["host_cache_bytes"] = int(float(cfg["host_cache_gb"]) * (1 << 30))
    return ControllerConfig(
        state_dir=state_dir_path(cfg.get("state_dir")),
        nodes=num_nodes,
        egress_gbps=per_node_numbers(cfg, "egress_gbps"),
        ingress_gbps=per_node_numbers(cfg, "ingress_gbps"),
        host_groups=tuple(host_groups(cfg)),
        emulation=cfg.get("emulation"),
        step_profile_dir=step_profile_dir(cfg),
        **given,
        **cfg["cluster_settings"],
    )


def resolve_api_key(flag: str | None, config: str | None) -> str | None:
    """The API key (flag, else `$SURGE_API_KEY`, else the config's), or None: no auth. An
    empty or blank key is an error, never "no auth" (issue 36)."""
    for source, value in (
        ("--api-key", flag),
        ("$SURGE_API_KEY", os.environ.get("SURGE_API_KEY")),
        ("the config's api_key", config),
    ):
        if value is None:
            continue
        if not value.strip():
            raise SurgeError(
                f"{source} is empty; give a key, or leave it unset to serve without auth"
            )
        return value
    return None


def machine_facts() -> MachineFacts:
    """This machine's CPUs (those this process may use), available memory and /dev/shm."""
    meminfo = dict(
        (line.split(":")[0], int(line.split()[1]) * 1024)
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.split()[1:2] and line.split()[1].isdigit()
    )
    shm = Path("/dev/shm")
    return MachineFacts(
        cpus=len(os.sched_getaffinity(0)),
        available_memory_bytes=meminfo.get("MemAvailable", meminfo.get("MemFree", 0)),
        shm_total_bytes=shutil.disk_usage(shm).total if shm.is_dir() else 0,
    )


def check_machine(nodes: int, host_cache_bytes: int, allow_overcommit: bool) -> None:
    """Refuse (one `SurgeError` with the numbers) a local cluster this machine cannot hold
    (`policy/nodes/machine_fit.py`), unless `--allow-overcommit`."""
    if allow_overcommit:
        return
    problems = machine_problems(ClusterAsk(nodes, host_cache_bytes), machine_facts())
    if problems:
        raise SurgeError("; ".join(problems) + " (or pass --allow-overcommit)")


def read_chat_template(path: Path) -> str:
    """The text of a `--chat-template` file, or one `SurgeError` line saying why not."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise SurgeError(
            f"--chat-template {path}: cannot read it ({e.__class__.__name__})"
        ) from None
    if not text.strip():
        raise SurgeError(f"--chat-template {path} is empty; give a Jinja chat template file")
    from surge.api.chat import ChatTemplate

    try:  # compiled now: a broken one is one line here, not a 400 on every chat request
        ChatTemplate(text)
    except SurgeError as e:
        raise SurgeError(f"--chat-template {path}: {e}") from None
    return text


def check_stored(stored: dict[str, Any], given: dict[str, Any], state_dir: Path) -> None:
    """A deployment this start asks for (`--model`, the config file) under the name of one
    the state directory keeps already: the stored one is what serves, so an ask that differs
    (another model, strategy, ...) is one `SurgeError` line, never silently dropped."""
    from surge.control.spec import DeploymentSpec

    want = DeploymentSpec.from_json(given).to_json()
    differ = [k for k, v in want.items() if stored.get(k) != v]
    if not differ:
        return
    name = given["name"]
    raise SurgeError(
        f"deployment {name!r} is stored in {state_dir} with another {', '.join(differ)} "
        f"(it serves {stored.get('model')}, {stored.get('strategy')}); to change it, "
        f"`surge delete {name}` on the running server and deploy again, or use another "
        "--name or --state-dir"
    )
