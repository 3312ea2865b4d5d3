"""Both bodies' timelines of one FlexPipe §9 scenario, request by request: where they part.

In: a result of `benchmarks.emulation.flexpipe` (its JSON: the emulated runtime's
`request_timeline` and `scale_out_timeline` per CV and variant, and the settings it ran)
and one (CV, variant). Out: the simulator's run of the same scenario (same trace, deployment
and seed) beside it, printed (and with `--out`, written as JSON): per request in arrival
order, when each body routed it, where (the endpoint and its stages), its first token and
TTFT; then each body's scale-outs (decision, serving, stages). A request whose TTFT differs
shows which step moved it: the routing (a group up earlier or later), the batch it joined,
or its prefill. Times are emulated seconds (EMULATED: the runtime's figures come from the
result file, with its load and violations).

Usage: python -m benchmarks.emulation.flexpipe_timeline --cv 1 --variant flexpipe \\
           [--json benchmarks/results/emulation/emulation_flexpipe.json] [--out FILE]
"""

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.emulation.flexpipe import scenario, simulate_one
from surge.emulation import EmulationConfig

RESULT = Path("benchmarks/results/emulation/emulation_flexpipe.json")


def emulated_rows(run: dict) -> tuple[list[dict], list[dict]]:
    """The runtime's requests (arrival order) and scale-outs from one emulated run."""
    stages = {p["name"]: len(p["stages"]) for p in (run.get("flexpipe") or {}).get("pipelines", [])}
    reqs = [
        {
            "arrival_s": a,
            "routed_s": routed,
            "first_token_s": first,
            "endpoint": (hops or ["-"])[0],
            "stages": stages.get((hops or ["-"])[0]),
        }
        for a, routed, first, _second, _done, hops in sorted(run["request_timeline"])
    ]
    outs = [
        {
            "decided_s": s["started_s"],
            "nodes": s["nodes"],
            "up_s": min(s["up"].values(), default=None),
        }
        for s in run.get("scale_out_timeline", [])
    ]
    return reqs, outs


def simulated_rows(res: Any) -> tuple[list[dict], list[dict]]:
    """The simulator's requests (arrival order) and endpoints from its raw result."""
    order = sorted(range(len(res.arrival_s)), key=lambda i: res.arrival_s[i])
    reqs = []
    for i in order:
        ep = int(res.endpoint[i])
        reqs.append(
            {
                "arrival_s": round(float(res.arrival_s[i]), 3),
                "routed_s": round(float(res.dispatched_s[i]), 3),
                "first_token_s": round(float(res.first_token_s[i]), 3),
                "endpoint": ep,
                "stages": res.endpoints_up.get(ep, (None, None))[1],
            }
        )
    # endpoint ids count up as scale-outs create them: the k-th decision made the k-th
    decided = [round(t, 3) for t, _, kind, _ in res.scale_events if kind == "scale-out"]
    ups = sorted((ep, round(t, 3), n) for ep, (t, n) in res.endpoints_up.items())
    outs = [
        {"decided_s": d, "endpoint": ep, "up_s": up, "stages": n}
        for d, (ep, up, n) in zip(decided, ups, strict=False)
    ]
    return reqs, outs


def ttft(row: dict) -> float | None:
    if row["first_token_s"] is None or row["first_token_s"] < 0:
        return None
    return round(row["first_token_s"] - row["arrival_s"], 3)


def show(emu: tuple[list, list], sim: tuple[list, list]) -> str:
    lines = [
        f"{'arrival':>8} | {'emulated: routed':>16} {'first':>6} {'ttft':>6} "
        f"{'endpoint (stages)':>22} | {'simulated: routed':>17} {'first':>6} {'ttft':>6} "
        f"{'ep (st)':>9}"
    ]
    for e, s in zip(emu[0], sim[0], strict=False):
        lines.append(
            f"{e['arrival_s']:8.3f} | {e['routed_s']:16.3f} {e['first_token_s']:6.3f} "
            f"{ttft(e):6.3f} {str(e['endpoint'])[-14:]:>16} ({e['stages']})"
            f" | {s['routed_s']:17.3f} {s['first_token_s']:6.3f} {ttft(s):6.3f} "
            f"{s['endpoint']:>5} ({s['stages']})"
        )
    lines.append("scale-outs, emulated: " + json.dumps(emu[1]))
    lines.append("scale-outs, simulated: " + json.dumps(sim[1]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, default=RESULT, help="a flexpipe emulation result")
    ap.add_argument("--cv", default="1")
    ap.add_argument("--variant", default="flexpipe")
    ap.add_argument("--out", type=Path, default=None, help="write both timelines here (JSON)")
    args = ap.parse_args()
    if not args.json.is_file():
        ap.error(f"--json {args.json}: no such file (run benchmarks.emulation.flexpipe first)")
    report = json.loads(args.json.read_text())
    run = report["emulated"].get(args.cv, {}).get(args.variant)
    if run is None:
        have = {cv: sorted(row) for cv, row in report["emulated"].items()}
        ap.error(f"no emulated run of CV {args.cv} {args.variant} in {args.json} (it has {have})")
    knobs = scenario(report["settings"])
    config = EmulationConfig.parse(report["emulate"], report["time_dilation"])
    _, res = simulate_one(knobs, config, float(args.cv), args.variant)
    emu, sim = emulated_rows(run), simulated_rows(res)
    head = f"EMULATED {report['emulate']} D={report['time_dilation']:g} CV {args.cv}"
    print(f"{head} {args.variant}: load {run.get('load_average')}, {run.get('emulation')}")
    print(show(emu, sim))
    if args.out is not None:
        body = {"emulated": {"requests": emu[0], "scale_outs": emu[1]}}
        body["simulated"] = {"requests": sim[0], "scale_outs": sim[1]}
        args.out.write_text(json.dumps(body, indent=1))


if __name__ == "__main__":
    main()
