"""Block throughput of one transport connection on loopback, plain TCP vs TLS, same run.

What it measures: a sender process pushes `--blocks` frames of `--block-mb` MiB each over
one authenticated `Connection` (`runtime/transport.py`); a receiver process lands every
payload in one pre-allocated buffer (as an agent lands a block in its tier) and answers
each frame; the time from the first send to the last answer gives GB/s. Plain and TLS
(`runtime/security/tls.py`, certificates from `surge node certs`) alternate for `--repeats` rounds;
the JSON holds every round, the medians and TLS/plain as a ratio. Loopback has no wire
limit, so this is the CPU cost of TLS on this machine: the ceiling of one connection.

    python -m benchmarks.systems.tls_throughput
    # -> benchmarks/results/systems/tls_throughput.{json,png}
"""

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from surge.runtime.handshake import accept_hello, connect
from surge.runtime.security.tls import TlsConfig
from surge.runtime.transport import Connection

TOKEN = "benchmark-token-0123456789abcdef"
RESULTS = Path(__file__).resolve().parent.parent / "results" / "systems"


def _receiver(port_out, tls: TlsConfig | None, block_bytes: int) -> None:
    """One connection: land each payload in the same buffer, answer each frame."""

    async def serve() -> None:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        port_out.put(listener.getsockname()[1])
        loop = asyncio.get_running_loop()
        sock, _ = await loop.sock_accept(listener)
        conn = Connection(sock)
        ctx = tls.load().server if tls else None
        await accept_hello(conn, TOKEN, "receiver", tls=ctx)
        buf = memoryview(bytearray(block_bytes))
        while True:
            header, _ = await conn.recv(sink=lambda h: buf)
            if header.get("op") == "done":
                break
            await conn.send({"ok": True})
        conn.close()
        listener.close()

    asyncio.run(serve())


async def _send(port: int, tls: TlsConfig | None, blocks: int, block_bytes: int) -> float:
    conn = await connect("127.0.0.1", port, TOKEN, "sender", tls=tls.load().client if tls else None)
    payload = os.urandom(block_bytes)
    t0 = time.perf_counter()
    for i in range(blocks):
        await conn.request({"op": "block", "index": i}, payload)
    took = time.perf_counter() - t0
    await conn.send({"op": "done"})
    conn.close()
    return took


def one_round(tls: TlsConfig | None, blocks: int, block_bytes: int) -> float:
    """GB/s of one connection (a fresh receiver process each round)."""
    q = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_receiver, args=(q, tls, block_bytes))
    proc.start()
    try:
        took = asyncio.run(_send(q.get(timeout=60), tls, blocks, block_bytes))
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return blocks * block_bytes / took / 1e9


def draw(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    modes = ["plain", "tls"]
    ax.bar(modes, [report["median_gbytes_per_s"][m] for m in modes], color=["#4c72b0", "#dd8452"])
    for m in modes:
        ax.scatter([m] * len(report["rounds_gbytes_per_s"][m]), report["rounds_gbytes_per_s"][m],
                   color="k", s=10, zorder=3)  # fmt: skip
    ax.set_ylabel("GB/s, one connection")
    ax.set_title(f"Loopback block throughput, TLS/plain = {report['tls_over_plain']:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=64)
    ap.add_argument("--block-mb", type=float, default=16.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=RESULTS / "tls_throughput.json")
    args = ap.parse_args()
    block_bytes = int(args.block_mb * (1 << 20))
    with tempfile.TemporaryDirectory() as d:
        cli = [sys.executable, "-m", "surge.cli", "node", "certs", d, "--members", "a"]
        subprocess.run(cli, check=True, capture_output=True)
        tls = TlsConfig(Path(d, "a.pem"), Path(d, "a.key"), Path(d, "ca.pem"))
        rounds: dict[str, list[float]] = {"plain": [], "tls": []}
        for _ in range(args.repeats):  # alternate, so drift hits both alike
            rounds["plain"].append(one_round(None, args.blocks, block_bytes))
            rounds["tls"].append(one_round(tls, args.blocks, block_bytes))
            print({k: round(v[-1], 3) for k, v in rounds.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in rounds.items()}
    report = {
        "benchmark": "tls_throughput",
        "what": "one transport connection on loopback: blocks landed in a pre-allocated "
        "buffer, one answer per block; sender and receiver in two processes",
        "blocks": args.blocks,
        "block_bytes": block_bytes,
        "rounds_gbytes_per_s": rounds,
        "median_gbytes_per_s": med,
        "tls_over_plain": med["tls"] / med["plain"],
        "tls": f"{ssl.OPENSSL_VERSION}; mutual TLS, P-256 certificates (surge node certs)",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    draw(report, args.out.with_suffix(".png"))
    print(json.dumps({"median_gbytes_per_s": med, "tls_over_plain": report["tls_over_plain"]}))


if __name__ == "__main__":
    main()
