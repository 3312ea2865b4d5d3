"""`surge serve`: the controller, N local node agents and the OpenAI-compatible HTTP API.

Flags and a `--config FILE` (YAML or TOML) set the same things; flags win. With no
deployment stored, given or configured, the default model is deployed: SmolLM2-135M-Instruct
as `smollm2` where ./setup.sh imported it, else the tiny random model as `surge-tiny`.
Ctrl-C (or SIGTERM) stops the server, the controller and every agent it started.
"""

import asyncio
import contextlib
import gc
import json
import logging
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from surge.cli.listener import bind_listener, check_port
from surge.cli.serve_cluster import check_launcher_flags, cluster_settings
from surge.cli.serve_config import (
    SERVE_STRATEGIES,
    check_machine,
    check_stored,
    controller_config,
    load_config,
    make_state_dir,
    read_chat_template,
    resolve_api_key,
)
from surge.cli.serve_emulation import emulated_store, emulation_config
from surge.control.registry import check_model_source
from surge.control.settings import DEFAULT_HOST_CACHE_BYTES, ControllerConfig
from surge.errors import SurgeError
from surge.policy.systems import serve_system
from surge.runtime.transport import STALL_TIMEOUT_S

log = logging.getLogger(__name__)


def serve(
    model: Annotated[
        str | None,
        typer.Option(
            help="Store, HF checkpoint or GGUF store to deploy (default: SmolLM2 where "
            "./setup.sh imported it, else the tiny model)."
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Deployment name for --model.")] = None,
    chat_template: Annotated[
        Path | None,
        typer.Option(
            help="Jinja chat template file for --model or the default model, instead of "
            "the model's own (a model without one answers chat requests with 400)."
        ),
    ] = None,
    strategy: Annotated[
        str | None,
        typer.Option(
            help="Scale-out strategy of --model or the default model: "
            f"{', '.join(SERVE_STRATEGIES)} (default lambdascale)."
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Local node agents (default 4).")] = None,
    link_gbps: Annotated[
        float | None, typer.Option(help="Per-node link cap, Gbit/s (default: none).")
    ] = None,
    host: Annotated[str | None, typer.Option(help="Listen address (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000; 0: any free).")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Require `Authorization: Bearer KEY` on /v1/*.")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(help="Deployments database and registry (default $SURGE_HOME/serve)."),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML or TOML file of settings.")] = None,
    max_body_mb: Annotated[
        float | None, typer.Option(help="Largest request body, MiB (default 16; 413 beyond).")
    ] = None,
    launcher: Annotated[
        str,
        typer.Option(
            help="Where agents run: local (processes), ray (one actor each) or static "
            "(running agents, --agents)."
        ),
    ] = "local",
    agents: Annotated[
        str | None,
        typer.Option(help="With --launcher static: the agents' HOST:PORT, comma-separated."),
    ] = None,
    agents_timeout: Annotated[
        float | None,
        typer.Option(help="With --launcher static: seconds to wait for them (default 120)."),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="With --launcher static: the cluster token's file ($SURGE_TOKEN)."),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="TLS to the agents: this controller's certificate.")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS: its private key (PEM).")] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(help="TLS: the cluster CA (`surge node certs` makes one).")
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(help="With --launcher ray: a running cluster (default: a local one)."),
    ] = None,
    agent_host: Annotated[
        str | None,
        typer.Option(
            help="With --launcher ray: node-ip makes each agent listen on its Ray node's own "
            "address (a cluster across hosts; default 127.0.0.1)."
        ),
    ] = None,
    cluster: Annotated[
        str,
        typer.Option(
            help="With --launcher local: loopback (processes here) or netns (each agent in "
            "its own network namespace, tc-shaped links, a CPU quota each; needs root)."
        ),
    ] = "loopback",
    emulate: Annotated[
        str | None,
        typer.Option(
            help="GPU-time emulation: agents paced as PRESET:MODEL of the simulator's profiles, "
            "e.g. lambdascale-testbed1:llama2-13b (docs/emulation.md); --nodes shrinks the "
            "preset (default: one agent per GPU of it)."
        ),
    ] = None,
    time_dilation: Annotated[
        float | None,
        typer.Option(help="With --emulate: real seconds per emulated second (default 1)."),
    ] = None,
    stall_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds a silent agent or peer (a link down, a host gone) takes to count as "
            f"gone, for this controller and the agents it starts (default {STALL_TIMEOUT_S:g}; "
            "3 to 3600)."
        ),
    ] = None,
    allow_overcommit: Annotated[
        bool,
        typer.Option(
            help="Start even if --nodes or host_cache_gb exceed this machine's memory, CPUs "
            "or /dev/shm (checked for --launcher local)."
        ),
    ] = False,
) -> None:
    """Serve models over an OpenAI-compatible API on a cluster of node agents."""
    check_launcher_flags(launcher, cluster, emulate, ray_address, agent_host)
    if name is not None and model is None:  # it names --model's deployment, nothing else
        raise SurgeError(
            "--name names the deployment of --model; give --model DIR too (the default "
            "model is served under its own name)"
        )
    cfg = load_config(config) if config is not None else {}
    flags = {
        "nodes": nodes,
        "link_gbps": link_gbps,
        "host": host,
        "port": port,
        "state_dir": str(state_dir) if state_dir else None,
        "max_body_mb": max_body_mb,
        "emulate": emulate,
        "time_dilation": time_dilation,
        "stall_timeout_s": stall_timeout_s,
    }
    cfg.update({k: v for k, v in flags.items() if v is not None})
    tls_flags = {"tls_cert": tls_cert, "tls_key": tls_key, "tls_ca": tls_ca}
    cluster_flags = {"agents": agents, "agents_timeout_s": agents_timeout, "token_file": token_file,
                     "agent_host": agent_host}  # fmt: skip
    cfg["cluster_settings"] = cluster_settings(launcher, tls_flags | cluster_flags, cfg)
    if launcher == "static" and "nodes" not in cfg:
        cfg["nodes"] = len(cfg["cluster_settings"]["agents"])  # one agent per entry
    emulation = emulation_config(cfg, launcher)
    if emulation is not None and "nodes" not in cfg:
        cfg["nodes"] = emulation.num_gpus
    cfg["api_key"] = resolve_api_key(api_key, cfg.get("api_key"))
    if strategy is not None:
        cfg["strategy"] = strategy
    strategy_ = cfg.get("strategy", "lambdascale")
    serve_system(strategy_)  # before any agent starts: one error line naming the choices
    num_nodes = int(cfg.get("nodes", 4))
    if num_nodes < 1:
        raise SurgeError(f"--nodes must be >= 1 (got {num_nodes})")
    if launcher == "local":  # agents run here: they must fit (issue 36)
        cache_gb = cfg.get("host_cache_gb")
        check_machine(
            num_nodes,
            int(cache_gb * (1 << 30)) if cache_gb is not None else DEFAULT_HOST_CACHE_BYTES,
            allow_overcommit or bool(cfg.get("allow_overcommit", False)),
        )
    if cfg.get("link_gbps") is not None and cfg["link_gbps"] <= 0:
        raise SurgeError("--link-gbps must be > 0")
    from surge.api.intake import IntakeLimits  # here: `surge --help` stays fast

    limits = IntakeLimits(**({"max_body_bytes": int(cfg["max_body_mb"] * (1 << 20))}
                             if "max_body_mb" in cfg else {}))  # fmt: skip
    cfg["intake"] = limits
    port_ = int(cfg.get("port", 8000))
    check_port(port_)
    # The default strategy (flag, else config file) applies to deployments naming none.
    deployments = [{"strategy": strategy_, **d} for d in cfg.get("deployments", [])]
    chat = {"chat_template": read_chat_template(chat_template)} if chat_template else {}
    if model is not None:
        path = Path(model).expanduser().resolve()
        # Before any agent starts (it used to fail once they had). Only the flag: a config
        # file's deployment may be stored already, and a stored one whose store went is
        # restored as failed (listed, deletable) while the others serve (docs/control.md).
        check_model_source(path, model)
        deployments.append(
            {"name": name or path.name, "model": str(path), "strategy": strategy_, **chat}
        )
    logging.getLogger().setLevel(cfg.get("log_level", "WARNING").upper())
    if emulation is not None:
        cfg["emulation"] = emulated_store(emulation, deployments, num_nodes, cluster)
    cfg["launcher"], cfg["ray_address"] = launcher, ray_address
    cfg["cluster"] = cluster
    cfg["agent_host"] = agent_host or "127.0.0.1"
    ccfg = controller_config(
        cfg, num_nodes
    )  # checked before the port binds: nothing bound on a bad one
    # Bind before anything starts: a busy port is one error line, not a started cluster.
    sock = bind_listener(cfg.get("host", "127.0.0.1"), port_)
    try:  # after the port: a busy port must leave nothing behind
        make_state_dir(ccfg.state_dir)
    except SurgeError:
        sock.close()
        raise
    # A terminal's Ctrl-C reaches the whole foreground process group: agents killed by it
    # would leave their shared memory to their resource trackers ("leaked shared_memory")
    # and look like failed nodes. Local agents run in process groups of their own
    # (`spawn_agent`); Ray's processes inherit SIGINT ignored until the controller started.
    # This process handles SIGINT from its event loop on, and stops the agents itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        asyncio.run(_serve(cfg, ccfg, sock, deployments, {"strategy": strategy_, **chat}))
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sock.close()


SHUTDOWN_GRACE_S = 5.0
"""On Ctrl-C, how long open responses may finish before they end with the shutdown error."""


async def _serve(
    cfg: dict[str, Any],
    ccfg: ControllerConfig,
    sock: socket.socket,
    deployments: list,
    default: dict,
) -> None:
    """`default`: the settings (strategy, chat template) of the default model's deployment."""
    import uvicorn

    from surge.api.app import create_app
    from surge.control.controller import Controller
    from surge.model.default_store import default_model

    # What the imports made (torch among them) lives as long as the server: frozen, the
    # collector's full passes skip it (they took ~11% of `surge serve`'s CPU in the tests).
    gc.freeze()
    state = ccfg.state_dir
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    controller = Controller(ccfg)
    local = ccfg.launcher == "local"
    if local:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        start = loop.create_task(controller.start())
        if not local:
            await asyncio.wait({start})
            loop.add_signal_handler(signal.SIGINT, stop.set)
        await _until(start, stop)
        setup = loop.create_task(_deploy(controller, deployments, default, default_model))
        await _until(setup, stop)
        app = create_app(controller, cfg.get("api_key"), limits=cfg["intake"])
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                lifespan="off",
                timeout_graceful_shutdown=SHUTDOWN_GRACE_S + STOP_TIMEOUT_S,  # a backstop
            )
        )
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign]
        task = loop.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            bound = sock.getsockname()
            print(
                json.dumps(
                    {
                        "ready": True,
                        "url": f"http://{bound[0]}:{bound[1]}",
                        "port": bound[1],
                        "nodes": ccfg.nodes,
                        "models": sorted(controller.deployments),
                        "state_dir": str(state),
                    }
                ),
                flush=True,
            )
        waiter = loop.create_task(stop.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        server.should_exit = True
        # Past their grace, open responses end with the shutdown error (503; a stream's error
        # event and [DONE]) as the controller stops, before uvicorn would cancel them (a
        # plain-text 500 with a traceback; a stream cut off mid-way).
        if not (await asyncio.wait({task}, timeout=SHUTDOWN_GRACE_S))[0]:
            await _stop_bounded(controller)
        await task
    except _Stopped:
        pass  # Ctrl-C before the API was up: stop what started, quietly
    finally:
        if not controller.stopping:
            await _stop_bounded(controller)
        sys.stdout.flush()


STOP_TIMEOUT_S = 15.0
"""How long the controller may take to stop (deployments torn down, agents told); past it
the agents are killed. With uvicorn's grace before it and the agents' SIGTERM grace after,
a stop takes at most about 30 s whatever state the cluster is in (a frozen agent included)."""


async def _stop_bounded(controller: Any) -> None:
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await controller.stop()
    except Exception as e:  # TimeoutError, or an agent that answered garbage while stopping
        log.warning("the controller did not stop cleanly (%r): killing its agents", e)
        if controller.cluster is not None:
            await asyncio.to_thread(controller.cluster.stop, 1.0)


class _Stopped(Exception):
    """Ctrl-C or SIGTERM arrived while starting."""


async def _until(task: asyncio.Task, stop: asyncio.Event):
    """Wait for `task`; cancel it and raise `_Stopped` if `stop` is set first."""
    waiter = asyncio.get_running_loop().create_task(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if stop.is_set() and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise _Stopped
        result = task.result()
        if stop.is_set():
            raise _Stopped
        return result
    finally:
        waiter.cancel()


async def _deploy(controller, deployments: list, default: dict, default_model):
    """The configured deployments not stored yet, else the default model (SmolLM2 where
    setup imported it, else the tiny random one)."""
    stored = {d["name"]: d for d in controller.describe_all()}
    for d in deployments:
        if d["name"] in stored:  # restored as stored: a different ask must not be dropped
            check_stored(stored[d["name"]], d, controller.config.state_dir)
        else:
            await controller.create(d)
    if not controller.deployments:
        store, default_name = await asyncio.to_thread(default_model)
        await controller.create({"name": default_name, "model": str(store), **default})
