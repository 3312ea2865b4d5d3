"""`surge serve`'s settings of where the agents are and how they are reached: the launcher
(`local`, `ray`, `static`), the static launcher's agent list and token, Ray's placement, TLS.

What flows: the flags and the config file's keys in (`check_launcher_flags`: which of them go
together); out, the `ControllerConfig` fields (`agents`, `agents_timeout_s`, `token_file`,
`tls`, `ray_placement`, `ray_gpus_per_agent`, `allow_plain`) checked once, so a bad value is
one `error:` line before anything starts.
Owned by the CLI.
"""

from pathlib import Path
from typing import Any

from surge.errors import SurgeError
from surge.runtime.launch.ray_placement import PLACEMENTS
from surge.runtime.launch.static_cluster import parse_entry
from surge.runtime.security.cluster_token import resolve_token
from surge.runtime.security.tls import TlsConfig, check_plain_allowed

LAUNCHERS = ("local", "ray", "static")
CLUSTERS = ("loopback", "netns")


def check_launcher_flags(
    launcher: str,
    cluster: str,
    emulate: str | None,
    ray_address: str | None,
    agent_host: str | None,
) -> None:
    """The launcher's and local cluster's flags, together: a combination that cannot run, or
    a machine that lacks what it needs (netns, Ray), is one error line before anything
    starts."""
    if launcher not in LAUNCHERS:
        raise SurgeError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if emulate is not None and launcher != "local":
        raise SurgeError("--emulate needs --launcher local (a loopback or netns cluster)")
    if ray_address is not None and launcher != "ray":
        raise SurgeError("--ray-address needs --launcher ray")
    if agent_host is not None and launcher != "ray":
        raise SurgeError("--agent-host needs --launcher ray")
    if cluster not in CLUSTERS:
        raise SurgeError(f"--cluster {cluster!r} is not one of {', '.join(CLUSTERS)}")
    if cluster == "netns":
        if launcher != "local":
            raise SurgeError("--cluster netns needs --launcher local")
        from surge.runtime.launch.netns_cluster import require_netns

        require_netns()  # one line naming what this machine lacks
    if launcher == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise SurgeError("--launcher ray needs Ray: pip install 'surge[ray]' (ray==2.60.0)")


def agent_entries(value: Any) -> tuple[str, ...]:
    """`--agents` ("a:1,b:2") or the config's `agents` (that string, or a list of them)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(x, str) for x in items):
        raise SurgeError(f"agents must be HOST:PORT entries, comma-separated (got {value!r})")
    entries = tuple(x.strip() for x in items if x.strip())
    for entry in entries:
        parse_entry(entry)
    return entries


def ray_settings(launcher: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """The config file's `ray_placement` and `ray_gpus_per_agent`, checked."""
    out: dict[str, Any] = {}
    placement, gpus = cfg.get("ray_placement"), cfg.get("ray_gpus_per_agent")
    if launcher != "ray" and (placement is not None or gpus is not None):
        raise SurgeError("ray_placement and ray_gpus_per_agent need --launcher ray")
    if placement is not None:
        if placement not in PLACEMENTS:
            raise SurgeError(
                f"ray_placement must be one of {', '.join(PLACEMENTS)} (got {placement!r})"
            )
        out["ray_placement"] = placement
    if gpus is not None:
        if gpus < 0:
            raise SurgeError(f"ray_gpus_per_agent must be >= 0 (got {gpus})")
        out["ray_gpus_per_agent"] = float(gpus)
    return out


def cluster_settings(
    launcher: str,
    flags: dict[str, Any],
    cfg: dict[str, Any],
) -> dict[str, Any]:
    """The cluster fields of `ControllerConfig`; `flags` win over the config file's keys
    (`agents`, `agents_timeout_s`, `token_file`, `tls_cert`, `tls_key`, `tls_ca`)."""
    if launcher not in LAUNCHERS:
        raise SurgeError(f"launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")

    def pick(key: str) -> Any:
        return flags[key] if flags.get(key) is not None else cfg.get(key)

    out: dict[str, Any] = ray_settings(launcher, cfg)
    tls = TlsConfig.from_options(pick("tls_cert"), pick("tls_key"), pick("tls_ca"))
    if tls is not None:
        tls.load()  # a missing or bad file: one line now, not a failed start later
        out["tls"] = tls
    if launcher == "ray":  # agents elsewhere: frames in clear only if asked for
        allow = bool(cfg.get("allow_plain", False))
        host = flags.get("agent_host") or "127.0.0.1"
        check_plain_allowed(host, tls, allow, "`allow_plain: true` in the config file")
        if allow:
            out["allow_plain"] = True
    elif cfg.get("allow_plain") is not None:
        raise SurgeError("allow_plain is a setting of --launcher ray (agents started by it)")
    agents, token_file = pick("agents"), pick("token_file")
    timeout_s = pick("agents_timeout_s")
    if launcher != "static":
        for key, value in (("--agents", agents), ("--token-file", token_file),
                           ("--agents-timeout", timeout_s)):  # fmt: skip
            if value is not None:
                raise SurgeError(f"{key} needs --launcher static")
        return out
    entries = agent_entries(agents) if agents is not None else ()
    if not entries:
        raise SurgeError(
            "--launcher static needs --agents HOST:PORT,... (agents started with "
            "`surge node run --host ADDR --port PORT --node-id N`)"
        )
    if timeout_s is not None:
        if not float(timeout_s) > 0:
            raise SurgeError(f"--agents-timeout must be > 0 s (got {timeout_s})")
        out["agents_timeout_s"] = float(timeout_s)
    path = Path(token_file).expanduser() if token_file is not None else None
    resolve_token(path, "the controller")  # checked now, read again where it is used
    out.update(agents=entries, token_file=path)
    return out
