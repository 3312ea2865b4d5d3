"""REPORT.md rows of blitzscale_figs.py's JSON: Fig. 15 (vs DistServe), Fig. 17 (the
ablation's steps, with the measured TBT splits of its losses) and Fig. 18 (scale done, with
the ramp to 80% of the peak prefill rate beside it).

In: benchmarks/results/paper/blitzscale_figs.json. Out: `rows.row` dicts for `report.py`.
"""

from rows import row

PAPER = "BlitzScale"


def report_rows(doc: dict) -> list[dict]:
    """REPORT.md rows (`report.py`), with the measured counterfactuals of the misses."""
    f15, f17, f18 = doc["fig15"], doc["fig17"], doc["fig18"]
    g = f17["gain_over_previous_step"]
    w = f17["workloads"]
    net = {n: v["+network_ttft_mean_s"] for n, v in g.items()}
    plan = [v[f"+plan_{m}"] for v in g.values() for m in ("ttft_mean_s", "tbt_mean_s")]
    live = max(max(v["+live_ttft_mean_s"], v["+live_tbt_mean_s"]) for v in g.values())
    every_step = all(x > -0.01 for v in g.values() for x in v.values())
    cf = f15["counterfactual_monitor_bounds"].get("blitzscale-in-flight-8")
    nan = float("nan")
    nm = f15["counterfactual_monitor_bounds"].get("blitzscale-no-mutation") or {
        "ttft_reduction_vs_half": nan,
        "tbt_reduction_vs_half": nan,
    }
    losses = [
        f"{step.split('_')[0]} {metric} {name} {x:+.0%}"
        for name, v in g.items()
        for step, x in v.items()
        if x <= -0.01
        for metric in ("TTFT" if "ttft" in step else "TBT",)
    ]
    # each TBT loss split: requests decoded on their prefill instance (no decode
    # instance then) against those handed off, before -> after the step
    order = list(next(iter(w.values())))
    tbt_split = []
    for name, v in g.items():
        for step, x in v.items():
            if x > -0.01 or "tbt" not in step:
                continue
            k = step.split("_")[0]
            a, b = w[name][order[order.index(k) - 1]], w[name][k]
            if "tbt_in_place_requests" not in b:
                continue
            handed = (
                f"handed off {_ms(a['tbt_handed_off_mean_s'], 1)} -> "
                f"{_ms(b['tbt_handed_off_mean_s'], 1)} ms"
            )
            if a["tbt_in_place_requests"] or b["tbt_in_place_requests"]:
                handed = (
                    f"in place {a['tbt_in_place_requests']} -> "
                    f"{b['tbt_in_place_requests']} requests at "
                    f"{_ms(a['tbt_in_place_mean_s'], 0)} -> "
                    f"{_ms(b['tbt_in_place_mean_s'], 0)} ms, " + handed
                )
            else:
                handed += " (none in place)"
            tbt_split.append(f"{k} {name}: {handed}")
    biggest = {
        name: max(("+network", "+plan", "+live"), key=lambda k: v[f"{k}_ttft_mean_s"])
        for name, v in g.items()
    }

    def pct(xs) -> str:
        return " / ".join(f"{x:+.1%}" for x in xs)

    code_tbt = [g[n]["+live_tbt_mean_s"] for n in ("7b-azurecode", "70b-azurecode") if n in g]
    monitor_only = []
    for name, res in w.items():
        alt = f17.get("live_split", {}).get(name, {}).get("monitor_mutation_only")
        for metric in ("ttft_mean_s", "tbt_mean_s"):
            monitor_only.append(1 - alt[metric] / res["+plan"][metric] if alt else nan)

    code = w["7b-azurecode"]
    split = f17.get("live_split", {}).get("7b-azurecode") or {
        k: {"ttft_mean_s": float("nan"), "tbt_mean_s": float("nan")}
        for k in ("live_only", "mutation_only")
    }
    return [
        row(
            PAPER,
            "Fig. 15",
            "vs DistServe (7B, AzureCode): 35% shorter mean TTFT and 41% shorter TBT than "
            "DistServe (half the GPUs); P99 within 2% of DistServe (all GPUs)",
            "35% / 41%; +2%",
            f"TTFT {f15['ttft_reduction_vs_half']:+.0%} and TBT {f15['tbt_reduction_vs_half']:+.0%}"
            f" shorter than half; P99 TTFT {f15['p99_ttft_vs_full']:+.0%} vs full, with "
            f"{f15['gpu_seconds_vs_full']:.2f}x its GPU-seconds",
            ordering=f15["ttft_reduction_vs_half"] > 0 and f15["tbt_reduction_vs_half"] > 0,
            reductions=(
                (f15["ttft_reduction_vs_half"], 0.35),
                (f15["tbt_reduction_vs_half"], 0.41),
            ),
            cause=_fig15_cause(f15, cf, nm),
        ),
        row(
            PAPER,
            "Fig. 17",
            "ablation (7B code, 8B conv, 70B code): +Network the big step, +Plan 0.4-5%, +Live "
            "up to 40% (AzureCode TBT)",
            "+Live up to 40%",
            f"TTFT gain +Network {pct(net.values())}; +Plan TTFT/TBT {pct(plan)}; +Live best "
            f"{live:.1%}",
            ordering=every_step,
            reductions=((live, 0.40),),
            cause="Steps that lose more than 1%: "
            + ("; ".join(losses) or "none")
            + ". Each TBT loss split into the requests decoded on their prefill instance "
            "(no decode instance serving or loading: `policy.blitzscale.handoff."
            "handoff_target`'s fallback; one still loading is waited for, §2.1 / §5.2; their "
            "decode steps share it with prefill) and those handed off, whose TBT counts the "
            "K/V hand-off and any wait for a decode instance to load: "
            + ("; ".join(tbt_split) or "n/a")
            + ". The biggest TTFT step per workload: "
            + ", ".join(f"{k} {v}" for k, v in biggest.items())
            + " (paper: +Network). +Live is live scaling plus prefill->decode mutation at "
            "the scale-out decision with a prefill instance as remedy (§5.2, §6.3); each "
            f"alone on +Plan (7B/code, +Plan TTFT {code['+plan']['ttft_mean_s']:.2f} s, "
            f"TBT {code['+plan']['tbt_mean_s'] * 1e3:.0f} ms): live scaling only "
            f"{split['live_only']['ttft_mean_s']:.2f} s / "
            f"{split['live_only']['tbt_mean_s'] * 1e3:.0f} ms, mutation only "
            f"{split['mutation_only']['ttft_mean_s']:.2f} s / "
            f"{split['mutation_only']['tbt_mean_s'] * 1e3:.0f} ms. +Live's AzureCode TBT "
            f"gain is {pct(code_tbt)} (7B / 70B; paper up to 40%). Counterfactual: mutation "
            "by the monitor alone (once decode is the bottleneck and a prefill instance "
            "idles, no remedy; surge before 2026-11-28): +Live TTFT / TBT gains "
            f"{pct(monitor_only)} (7B, 8B, 70B): larger TTFT gains, but decode stays on "
            "fewer instances and TBT, which counts each K/V hand-off, loses." + _partners_note(f17),
        ),
        fig18_row(f18),
    ]


def _gains(f17: dict, label: str) -> list[str]:
    """+Live's TTFT / TBT gains over +Plan per workload with `live_split`'s `label`."""
    rows = []
    for name, res in f17["workloads"].items():
        alt = f17.get("live_split", {}).get(name, {}).get(label)
        if not alt:
            continue
        plan = res["+plan"]
        ttft = 1 - alt["ttft_mean_s"] / plan["ttft_mean_s"]
        tbt = 1 - alt["tbt_mean_s"] / plan["tbt_mean_s"]
        rows.append(f"{name} {ttft:+.1%} / {tbt:+.1%}")
    return rows


def _partners_note(f17: dict) -> str:
    """+Live's gains with the live partner chosen otherwise (the counterfactuals
    `decode_partners` and `least_loaded` in `live_split`): BlitzScale §5.2 pairs each new
    instance with an overloaded prefill instance and takes its queue."""
    decode, least = _gains(f17, "decode_partners"), _gains(f17, "least_loaded")
    if not decode and not least:
        return ""
    text = (
        " Each new instance pairs with an overloaded prefill instance, which runs its live "
        "batches' last layers, and takes that instance's queue (§5.2: 'for each overloaded "
        "instance, we will identify an instance in the chain'; 'we redirect all queued "
        "requests from inst.0 to it'; 'autoscaling a prefill instance in P/D "
        "disaggregation')."
    )
    if least:
        text += (
            " Counterfactual: the least loaded prefill instance per batch, unpaired, every "
            "queue (unsourced, surge 2026-11-29 before this), +Live TTFT / TBT gains "
            + ", ".join(least)
            + "."
        )
    if decode:
        text += (
            " Counterfactual: decode instances as live partners too, the least loaded "
            "(unsourced, surge before 2026-11-29), +Live TTFT / TBT gains "
            + ", ".join(decode)
            + "."
        )
    return text


def _ms(seconds: float | None, digits: int) -> str:
    """Seconds as milliseconds, or n/a (no such request)."""
    return "n/a" if seconds is None else f"{seconds * 1e3:.{digits}f}"


PAPER_DONE_S = {"blitzscale": 1.1, "serverlessllm": 3.1}
"""§6.3 Fig. 18's scale-done times (s): BlitzScale improves its throughput "even before the
scaling is done (at time 1,100)"; S-LLM's "overall scaling is lengthy (finishes at time
3,100s)". The 2.8x is their ratio."""


def fig18_row(f18: dict) -> dict:
    """Fig. 18 judged as the paper states it: S-LLM's scale done over BlitzScale's (the
    16th instance serving, `last_instance_up_s`), with the time to 80% of the 16-instance
    prefill rate beside it (the row's headline until 2026-11-29, which compared that ramp
    with the paper's scale-done ratio)."""
    done = {n: v.get("last_instance_up_s") for n, v in f18["systems"].items()}
    if None in done.values():
        raise ValueError("Fig. 18: the JSON has no scale-done time (rerun --only fig18)")
    ratio = done["serverlessllm"] / done["blitzscale"]
    b, s = f18["systems"]["blitzscale"], f18["systems"]["serverlessllm"]
    return row(
        PAPER,
        "Fig. 18",
        "1 -> 16 instances of 7B on cluster A: NVLink broadcast to the copy's machine "
        "first, scale done ~1.1 vs ~3.1 for S-LLM (2.8x)",
        "2.8x",
        f"scale done (16th instance serving), the 16 asked for at once: BlitzScale "
        f"{done['blitzscale']:.2f} s, S-LLM {done['serverlessllm']:.2f} s ({ratio:.2f}x); "
        f"time to 80% of the 16-instance prefill rate {b['ramp_s']:.2f} s / "
        f"{s['ramp_s']:.2f} s ({f18['ramp_ratio']:.2f}x)" + _fig18_beside(f18),
        ordering=ratio > 1,
        sim_value=ratio,
        paper_value=PAPER_DONE_S["serverlessllm"] / PAPER_DONE_S["blitzscale"],
        cause=_fig18_cause(f18, done, ratio),
    )


def _fig18_beside(f18: dict) -> str:
    """Fig. 18's counterfactuals: scale done (and the 80% ramp), S-LLM / BlitzScale."""
    parts = []
    for key, what in (
        ("counterfactual_gradual", "as the monitor grows them one by one"),
        ("counterfactual_sllm_host_everywhere", "S-LLM's copy in every machine's host memory"),
    ):
        c = f18.get(key)
        if c:
            parts.append(f"{what} {_done_and_ramp(c)}")
    return "; " + "; ".join(parts) if parts else ""


def _done_and_ramp(c: dict) -> str:
    """A counterfactual's ratios: scale done where the JSON has it, and the 80% ramp."""
    ramp = f"{c['ramp_ratio']:.2f}x"
    if c.get("done_ratio") is None:
        return f"{ramp} (80% ramp)"
    return f"{c['done_ratio']:.2f}x (80% ramp {ramp})"


SSD_QUOTE = "our cluster only supports a 10 Gbps per-GPU bandwidth"
"""BlitzScale §6.1 (Table 1's SSD-GPU row): what one GPU reads from SSD at."""


def _fig18_cause(f18: dict, done: dict, ratio: float) -> str | None:
    """Why Fig. 18's ratio is off, from the script's counterfactuals (None when it is not)."""
    paper = PAPER_DONE_S["serverlessllm"] / PAPER_DONE_S["blitzscale"]
    if abs(ratio / paper - 1) <= 0.2:
        return None
    sllm = f18["systems"]["serverlessllm"]
    loads = sllm["loads"]
    text = (
        f"S-LLM's one host copy serves its own machine ({loads['memory']} loads from host "
        f"memory), the other {loads['ssd']} instances load from SSD at 10 Gb/s per GPU "
        f'(§6.1: "{SSD_QUOTE}"; Table 1 SSD-GPU 10 Gbps)'
    )
    if "ssd_load_at_10gbps_s" in f18:
        text += (
            f": each reads 7B for {f18['ssd_load_at_10gbps_s']:.1f} s, so S-LLM's 16th "
            f"instance serves at {done['serverlessllm']:.1f} s, where the paper's S-LLM "
            "finishes at 3.1 s (a finish its own 10 Gb/s per GPU cannot give 7B); "
            f"BlitzScale's serves at {done['blitzscale']:.2f} s (paper 1.1 s)"
        )
    shared = f18.get("counterfactual_ssd_shared_per_machine")
    if shared:
        text += (
            ". Counterfactual: each machine's 80 Gb/s shared by the loads on it with no "
            "per-GPU cap (the model before 2026-11-29; a load alone on its machine reads at "
            f"80 Gb/s): {_done_and_ramp(shared)}"
        )
    return text + _fig18_beside(f18) + "."


def _fig15_cause(f15: dict, cf: dict | None, nm: dict) -> str:
    """Why Fig. 15 misses: BlitzScale's monitor against DistServe's always-on GPUs, with
    the measured counterfactuals (the monitor surge shipped until 2026-11-28; no mutation)."""
    s = f15["systems"]
    b, half = s["blitzscale"], s["distserve-half"]
    m = f15.get("monitor_bounds", {})
    text = (
        "TTFT: BlitzScale autoscales from zero and DistServe-half keeps 16 GPUs always on; "
        "BlitzScale's §5.3 monitor holds each instance to the prompt tokens it prefills "
        f"within §3's {m.get('ttft_slo_s', 0.45) * 1e3:.0f}-ms SLO "
        f"({m.get('prompt_tokens_within_slo', float('nan')):,.0f}, profiled from the cost "
        "model), and asks for instances as waiting prompts pass it; a new one serves once "
        "loaded (or live, §4), while DistServe's are up before the burst: mean TTFT "
        f"{b['ttft_mean_s']:.2f} s vs {half['ttft_mean_s']:.2f} s (p99 "
        f"{b['ttft_p99_s']:.2f} vs {half['ttft_p99_s']:.2f} s) with "
        f"{b['gpu_seconds'] / half['gpu_seconds']:.2f}x DistServe-half's GPU-seconds."
    )
    if cf:
        text += (
            " Counterfactual: the monitor surge shipped until 2026-11-28 (8 requests in "
            f"flight per instance, unsourced): TTFT vs half {cf['ttft_reduction_vs_half']:+.0%}"
            f", TBT {cf['tbt_reduction_vs_half']:+.0%}, GPU-seconds "
            f"{cf['gpu_seconds_vs_full']:.2f}x full's (now "
            f"{f15['ttft_reduction_vs_half']:+.0%} / {f15['tbt_reduction_vs_half']:+.0%} / "
            f"{f15['gpu_seconds_vs_full']:.2f}x; paper +35% / +41%)."
        )
    return text + (
        " TBT counts the K/V hand-off (the first token is the prefill's): BlitzScale decodes "
        "on fewer instances than DistServe-half's fixed 8, so K/V from many prefill "
        "instances converges on fewer links; the monitor grows decode on that K/V ingress "
        "(§5.2's incast) but only up to its bound. Without the prefill->decode mutation "
        f"(§5.2): TTFT {nm['ttft_reduction_vs_half']:+.0%}, TBT "
        f"{nm['tbt_reduction_vs_half']:+.0%} vs half."
    )
