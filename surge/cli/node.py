"""`surge node run`: one node agent (started by a launcher, or by hand / a StatefulSet for
`--launcher static`); `surge node certs`: a cluster CA and certificates for TLS.

The cluster token comes from the SURGE_TOKEN environment variable or --token-file (never
the command line, where other users could read it). Prints one JSON line
`{"ready": true, "port": P}` when it listens.
"""

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer

from surge.cli.listener import check_port
from surge.cli.log_level import log_level as checked_log_level
from surge.cli.outputs import make_writable_dir
from surge.errors import SurgeError

app = typer.Typer(help="Run a node agent (normally started by a launcher).", no_args_is_help=True)


@app.command("run")
def run(
    node: Annotated[int, typer.Option("--node-id", help="This node's id.")],
    disk_dir: Annotated[Path, typer.Option(help="Directory of this node's disk tier.")],
    cluster_id: Annotated[str, typer.Option(help="Cluster name (shared-memory prefix).")] = "local",
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free port).")] = 0,
    egress_gbps: Annotated[float | None, typer.Option(help="NIC egress cap, Gbit/s.")] = None,
    ingress_gbps: Annotated[float | None, typer.Option(help="NIC ingress cap, Gbit/s.")] = None,
    remote_dir: Annotated[Path | None, typer.Option(help="Model registry directory.")] = None,
    remote_gbps: Annotated[float | None, typer.Option(help="Registry read cap, Gbit/s.")] = None,
    disk_gbps: Annotated[float | None, typer.Option(help="Disk tier read cap, Gbit/s.")] = None,
    pcie_gbps: Annotated[
        float | None, typer.Option(help="Host copy -> gpu tier cap, Gbit/s.")
    ] = None,
    emulate: Annotated[
        str | None,
        typer.Option(help="GPU-time emulation: PRESET:MODEL this node's steps are paced as."),
    ] = None,
    emulated_gpu: Annotated[
        str | None, typer.Option(help="With --emulate: the GPU type this node stands for.")
    ] = None,
    time_dilation: Annotated[
        float, typer.Option(help="With --emulate: real seconds per emulated second.")
    ] = 1.0,
    max_num_seqs: Annotated[
        int, typer.Option(help="Running-batch limit of this node's engines.")
    ] = 64,
    max_kv_tokens: Annotated[
        int, typer.Option(help="KV-cache capacity (tokens) of each runner on this node.")
    ] = 16384,
    device: Annotated[
        str, typer.Option(help="Where this node's engines run: auto, cpu, cuda[:N] (fake: tests).")
    ] = "auto",
    preload_engine: Annotated[
        bool, typer.Option(help="Import the engine before announcing readiness.")
    ] = True,
    fuse_projections: Annotated[
        bool, typer.Option(help="Fuse q/k/v and gate/up in this node's engines.")
    ] = True,
    compile_decode: Annotated[
        bool | None,
        typer.Option(
            help="Compile decode steps in the background (default on; $SURGE_COMPILE_DECODE)."
        ),
    ] = None,
    compile_quiet_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds with nothing in flight before this node's engines compile (default 2)."
        ),
    ] = None,
    compile_defer_max_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds requests may defer a compile once no transfer runs (default 40; "
            "inf: for good)."
        ),
    ] = None,
    pace_links: Annotated[
        bool, typer.Option(help="Pace the NIC caps here (off: the kernel shapes them).")
    ] = True,
    host_group: Annotated[
        str | None, typer.Option(help="Name of the machine this agent shares with others.")
    ] = None,
    host_mates: Annotated[
        str, typer.Option(help="Node ids of the other agents of the host group, comma-separated.")
    ] = "",
    host_gbps: Annotated[
        float | None, typer.Option(help="Fast link between host mates, Gbit/s (unset: unpaced).")
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(help="File holding the cluster token (default: $SURGE_TOKEN)."),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="TLS: this agent's certificate (PEM, signed by the CA).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="TLS: its private key (PEM).")] = None,
    tls_ca: Annotated[
        Path | None, typer.Option(help="TLS: the cluster CA; peers must present a cert it signed.")
    ] = None,
    allow_plain: Annotated[
        bool,
        typer.Option(help="Listen on a non-loopback --host without TLS (frames in clear)."),
    ] = False,
    stall_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="Seconds a silent peer or controller (a link down, a host gone) takes to "
            "count as gone (default 8; at least 3)."
        ),
    ] = None,
    fault_corrupt_sends: Annotated[int, typer.Option(hidden=True)] = 0,
    fault_shm_free_bytes: Annotated[int | None, typer.Option(hidden=True)] = None,
    log_level: Annotated[str, typer.Option(help="Logging level.")] = "WARNING",
) -> None:
    """Run one node agent until it is told to shut down."""
    from surge.config import EngineConfig
    from surge.runtime.node.agent import AgentConfig, run_agent
    from surge.runtime.security.cluster_token import resolve_token
    from surge.runtime.security.tls import TlsConfig, check_plain_allowed
    from surge.runtime.transport import check_stall_timeout

    token = resolve_token(token_file, "an agent")
    check_port(port)
    make_writable_dir(disk_dir, "--disk-dir")
    caps = (
        ("egress", egress_gbps),
        ("ingress", ingress_gbps),
        ("remote", remote_gbps),
        ("disk", disk_gbps),
        ("pcie", pcie_gbps),
    )
    for name, v in (*caps, ("host", host_gbps)):
        if v is not None and v <= 0:
            raise SurgeError(f"--{name}-gbps must be > 0 (got {v})")
    try:
        mates = tuple(int(m) for m in host_mates.split(",") if m.strip())
    except ValueError:
        raise SurgeError(f"--host-mates must be node ids like 1,2 (got {host_mates!r})") from None
    if stall_timeout_s is not None:
        try:
            check_stall_timeout(stall_timeout_s)
        except SurgeError as e:
            raise SurgeError(f"--stall-timeout-s: {e}") from None
    tls = TlsConfig.from_options(tls_cert, tls_key, tls_ca)
    if tls is not None:
        tls.load()  # a missing or bad file is an `error:` line now, not a failed start later
    check_plain_allowed(host, tls, allow_plain, "--allow-plain")
    logging.getLogger().setLevel(checked_log_level(log_level, "--log-level"))
    config = AgentConfig(
        node=node,
        cluster_id=cluster_id,
        token=token,
        disk_dir=disk_dir,
        host=host,
        port=port,
        egress_gbps=egress_gbps,
        ingress_gbps=ingress_gbps,
        remote_dir=remote_dir,
        remote_gbps=remote_gbps,
        disk_gbps=disk_gbps,
        pcie_gbps=pcie_gbps,
        emulate=emulate,
        emulated_gpu=emulated_gpu,
        time_dilation=time_dilation,
        engine=EngineConfig(
            max_num_seqs=max_num_seqs,
            max_kv_tokens=max_kv_tokens,
            fuse_projections=fuse_projections,
            device=device,
            **({} if compile_decode is None else {"compile_decode": compile_decode}),
            **({} if compile_quiet_s is None else {"compile_quiet_s": compile_quiet_s}),
            **({} if compile_defer_max_s is None else {"compile_defer_max_s": compile_defer_max_s}),
        ).validate(),
        preload_engine=preload_engine,
        pace_links=pace_links,
        host_group=host_group,
        host_mates=mates,
        host_gbps=host_gbps,
        tls=tls,
        allow_plain=allow_plain,
        **({} if stall_timeout_s is None else {"stall_timeout_s": stall_timeout_s}),
        fault_corrupt_sends=fault_corrupt_sends,
        fault_shm_free_bytes=fault_shm_free_bytes,
    )
    asyncio.run(run_agent(config))


@app.command("certs")
def certs(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the files into.")],
    members: Annotated[
        str, typer.Option(help="Certificates to make, comma-separated (one per member or role).")
    ] = "controller,agent",
    days: Annotated[int, typer.Option(help="Validity of the certificates, days.")] = 365,
) -> None:
    """Make a cluster CA (reused if OUT_DIR has one) and a certificate per member, for
    --tls-cert/--tls-key/--tls-ca (needs the openssl command)."""
    from surge.runtime.security.tls_certs import make_ca, make_member

    names = [m.strip() for m in members.split(",") if m.strip()]
    if not names:
        raise SurgeError("--members needs at least one name, like controller,agent")
    if days < 1:
        raise SurgeError(f"--days must be >= 1 (got {days})")
    make_writable_dir(out_dir, "OUT_DIR")
    if not (out_dir / "ca.pem").is_file():
        make_ca(out_dir, days)
    for name in names:
        make_member(out_dir, name, days)
    typer.echo(f"wrote {out_dir}/ca.pem and {', '.join(f'{n}.pem/.key' for n in names)}")
