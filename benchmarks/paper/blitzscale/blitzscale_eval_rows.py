"""REPORT.md rows of blitzscale_eval.py's JSON: §6.1 per workload, §6.2 GPU time (with the
measured counterfactual from its `rate_sensitivity` runs) and host-cache copies (Fig. 16,
over §6.1's runs).

In: benchmarks/results/paper/blitzscale_eval.json. Out: `rows.row` dicts for `report.py`.
"""

from rows import row, within_reduction

PAPER_6_1 = {"7b-azurecode": 0.555, "8b-azureconv": 0.310, "70b-azurecode": 0.861}
"""§6.1: BlitzScale's mean TTFT reduction vs S-LLM per workload (86.1% is BurstGPT's 70B,
replayed on Azure code here)."""
PAPER_6_1_TBT = {"7b-azurecode": 0.578, "8b-azureconv": 0.011, "70b-azurecode": 0.181}
"""§6.1: "BlitzScale has 86.1%, 55.5%, 31.0% shorter TTFT, and has 18.1%, 57.8% and 1.1%
shorter TBT than S-LLM, respectively" (mean TBT; the same order as the TTFT: 57.8% is
AzureCode's, where "the decode also fluctuates with the prefill", 1.1% AzureConv's, where
"decode instances seldom scale up or down")."""


def report_rows(doc: dict) -> list[dict]:
    """REPORT.md rows (`report.py`): §6.1 per workload, §6.2 GPU time and host cache."""
    rows = []
    sens = {
        r["system"]: r
        for r in doc["rate_sensitivity"]["rows"]
        if r["rate_scale"] == 2.0 and r["cluster"].startswith("blitzscale-a")
    }
    counterfactual = ""
    seven = doc["ttft_6_1"]["workloads"].get("7b-azurecode")
    if seven and "serverlessllm-keepalive60" in sens:
        k60 = sens["serverlessllm-keepalive60"]
        counterfactual = (
            "Counterfactual (7B, AzureCode x2): S-LLM with a 60-s keep-alive misses "
            f"{k60['cache_misses']} of {k60['loads']} loads (the paper's 20-46% regime) and "
            f"BlitzScale's reduction moves {seven['ttft_reduction_vs_serverlessllm']:.1%} -> "
            f"{1 - sens['blitzscale']['ttft_mean_s'] / k60['ttft_mean_s']:.1%}."
        )
    for name, w in doc["ttft_6_1"]["workloads"].items():
        red = w["ttft_reduction_vs_serverlessllm"]
        tbt_red = w.get("tbt_reduction_vs_serverlessllm")
        sllm = w["systems"]["serverlessllm"]
        miss = sllm["cache_misses"]
        ttft_ok = within_reduction(red, PAPER_6_1[name])
        # §6.1 claims both: shorter TTFT and shorter TBT than S-LLM, each by its X%
        tbt_ok = (
            tbt_red is not None and tbt_red > 0 and within_reduction(tbt_red, PAPER_6_1_TBT[name])
        )
        cause = ""
        if not ttft_ok:
            cause = _miss_cause(w, counterfactual) + _peak_note(doc.get("peak_check", {}).get(name))
            if name == "7b-azurecode":
                cause += _in_flight_note(doc, "ttft", red)
            if name == "8b-azureconv":
                cause += (
                    " §3 gives no 8B SLO: the monitor's bounds are profiled against the 7B's "
                    "(450 / 150 ms), an assumption."
                )
        if not tbt_ok:
            cause = (cause + " " if cause else "") + _tbt_cause(w, PAPER_6_1_TBT[name])
        if cause:
            cause += _partners_note(doc, name, w)
        tbt_text = "TBT not recorded" if tbt_red is None else f"TBT {_shorter(tbt_red)}"
        rows.append(
            row(
                "BlitzScale",
                f"§6.1 Fig. 13 {name}",
                f"mean TTFT and TBT vs S-LLM ({w['trace']}, {w['cluster']}): "
                f"{PAPER_6_1[name]:.1%} and {PAPER_6_1_TBT[name]:.1%} shorter; TTFT close to "
                "AllCache",
                f"TTFT {PAPER_6_1[name]:.1%}, TBT {PAPER_6_1_TBT[name]:.1%}",
                f"TTFT {red:.1%} shorter, {tbt_text}; TTFT "
                f"{w['ttft_mean_s_ratio_vs_allcache']:.2f}x AllCache; S-LLM misses {miss}",
                ordering=red > 0
                and w["ttft_mean_s_ratio_vs_allcache"] < 1.2
                and tbt_red is not None
                and tbt_red > 0,
                reductions=((red, PAPER_6_1[name]), (tbt_red, PAPER_6_1_TBT[name])),
                cause=cause or None,
            )
        )
    g = doc["gpu_time"]
    cause = None
    if "serverlessllm-keepalive60" in sens:
        k60 = sens["serverlessllm-keepalive60"]["gpu_seconds"]
        cause = (
            "S-LLM's monitor over-scales while its loads are slow (§6.2), but here its loads "
            "hit host memory: deployed with the paper's 5-min keep-alive (§6.2), it misses "
            "only where a host has not served for 5 minutes, which Azure code x2 rarely "
            "leaves. Counterfactual: S-LLM with a 60-s keep-alive (misses as the "
            f"paper's): reduction {g['gpu_reduction_vs_serverlessllm']:.1%} -> "
            f"{1 - sens['blitzscale']['gpu_seconds'] / k60:.1%} (paper 40%)"
        )
        if "serverlessllm-ssd-only" in sens:
            ssd = sens["serverlessllm-ssd-only"]["gpu_seconds"]
            cause += (
                "; every load from SSD (no host cache): "
                f"{1 - sens['blitzscale']['gpu_seconds'] / ssd:.1%}, the paper's 40% between "
                "the two"
            )
        cause += "." + _in_flight_note(doc, "gpu", g["gpu_reduction_vs_serverlessllm"])
        cause += _partners_note(doc, "7b-azurecode", doc["ttft_6_1"]["workloads"]["7b-azurecode"])

    rows.append(
        row(
            "BlitzScale",
            "§6.2 Fig. 14",
            "GPU time (7B, AzureCode): 40% lower than S-LLM",
            "40%",
            f"{g['gpu_reduction_vs_serverlessllm']:.1%} lower than S-LLM, "
            f"{g['gpu_reduction_vs_allcache']:.1%} than AllCache",
            ordering=g["gpu_reduction_vs_serverlessllm"] > 0,
            reductions=((g["gpu_reduction_vs_serverlessllm"], 0.40),),
            cause=cause,
        )
    )
    rows.append(fig16_row(doc["host_cache"]))
    return rows


def fig16_row(h: dict) -> dict:
    """§6.2 Fig. 16 over §6.1's three workloads ("host cache usage on S-LLM and BlitzScale
    under all three workloads"): BlitzScale at most one copy in every one, S-LLM more on
    average in every one."""
    w = h["workloads"]
    text = "; ".join(
        f"{name} {v['systems']['blitzscale']['max_copies']:.0f} vs mean "
        f"{v['systems']['serverlessllm']['mean_copies']:.1f} (max "
        f"{v['systems']['serverlessllm']['max_copies']:.0f})"
        for name, v in w.items()
    )
    return row(
        "BlitzScale",
        "§6.2 Fig. 16",
        "host-cache copies under §6.1's three workloads: BlitzScale always 1, S-LLM orders "
        "of magnitude more",
        "1 vs >> 1",
        f"BlitzScale (max) vs S-LLM copies, §6.1's runs: {text}",
        ordering=all(
            v["systems"]["blitzscale"]["max_copies"]
            <= 1
            < v["systems"]["serverlessllm"]["mean_copies"]
            for v in w.values()
        ),
    )


def _shorter(reduction: float) -> str:
    """A reduction as "X% shorter", or "X% longer" when it is negative."""
    return f"{reduction:.1%} shorter" if reduction >= 0 else f"{-reduction:.1%} longer"


def _tbt_cause(w: dict, paper: float) -> str:
    """Why a §6.1 workload's TBT is off, measured per request against S-LLM on the same
    trace (`tbt_measure.paired`): GPUs held and requests decoding per GPU while a request
    decoded; the TBT of short outputs (mostly the gap to the second token) and long ones
    (mostly the per-token step); of requests prefilled live and the rest; and the mean TBT
    split into the P/D hand-off's parts and the decode steps (`tbt_measure.handoff_split`)."""
    b, s = w["systems"]["blitzscale"], w["systems"]["serverlessllm"]
    p = w["tbt_vs_serverlessllm"]

    def pair(key: str) -> str:
        g = p[key]
        if not g["tbt_mean_s"]:
            return f"none {key.replace('_', ' ')}"
        ms = [f"{x * 1e3:.1f}" for x in g["tbt_mean_s"]]
        return f"{g['requests']} {key.replace('_', ' ')} {ms[0]} vs {ms[1]} ms"

    return (
        f"TBT: BlitzScale {b['tbt_mean_s'] * 1e3:.1f} vs S-LLM {s['tbt_mean_s'] * 1e3:.1f} ms "
        f"({_shorter(w['tbt_reduction_vs_serverlessllm'])}; paper {paper:.1%} shorter; median "
        f"{b['tpot_p50_s'] * 1e3:.1f} vs {s['tpot_p50_s'] * 1e3:.1f}, p99 "
        f"{b['tbt_p99_s'] * 1e3:.0f} vs {s['tbt_p99_s'] * 1e3:.0f}). Measured per request "
        f"(same trace): BlitzScale decodes on fewer GPUs, "
        f"{p['gpus_while_decoding_mean'][0]:.1f} vs {p['gpus_while_decoding_mean'][1]:.1f} "
        f"held at a decode's midpoint, {p['decoding_per_gpu_mean'][0]:.2f} vs "
        f"{p['decoding_per_gpu_mean'][1]:.2f} requests decoding per GPU (its §6.2 GPU-time "
        f"saving, {b['mutations']} prefill -> decode mutations, §5.2). TBT by output: "
        f"{pair('short')} (under 10 tokens: the gap to the second token "
        f"weighs most; {p['excess_share_short']:.0%} of BlitzScale's excess), "
        f"{pair('long')} (50+ tokens: the per-token step); by prefill: "
        f"{pair('live_prefilled')} (live scaling, §4), {pair('not_live_prefilled')}."
        + _tbt_parts(b, s)
    )


TBT_PARTS = (
    ("wait_decode_full_s", "waiting for a decode slot"),
    ("wait_decode_loading_s", "waiting for a loading decode instance"),
    ("kv_transfer_s", "K/V transfer"),
    ("decode_queue_s", "queued on the decode instance"),
    ("decode_steps_s", "decode steps after it"),
    ("decoded_where_prefilled_s", "requests never handed off (decoded where prefilled)"),
)
"""`tbt_measure.handoff_split`'s parts of a mean TBT, in the order a request meets them."""


def _tbt_parts(b: dict, s: dict) -> str:
    """Mean TBT split into the P/D hand-off's parts and the decode steps after it
    (`tbt_measure.handoff_split`, BlitzScale vs S-LLM), with each part's share of
    BlitzScale's excess; empty when the JSON has no split."""
    pb, ps = b.get("tbt_parts"), s.get("tbt_parts")
    if not pb or not ps:
        return ""
    excess = b["tbt_mean_s"] - s["tbt_mean_s"]
    text = ", ".join(
        f"{what} {pb[k] * 1e3:.2f} vs {ps[k] * 1e3:.2f}"
        + (f" ({(pb[k] - ps[k]) / excess:+.0%})" if excess > 0 else "")
        for k, what in TBT_PARTS
    )
    return (
        f" Mean TBT split per request (ms of TBT, BlitzScale vs S-LLM, share of the excess): "
        f"{text}; {pb['waited']} vs {ps['waited']} requests waited to be handed off "
        f"({pb['waited_none_serving']} vs {ps['waited_none_serving']} with no decode instance "
        f"serving; mean {pb['wait_mean_s']:.2f} vs {ps['wait_mean_s']:.2f} s)."
    )


def _partners_note(doc: dict, name: str, w: dict) -> str:
    """Workload `name`'s counterfactual with P/D decode instances as live partners (surge
    before 2026-11-29, `decode_partners_6_1`), against `ttft_6_1`'s S-LLM."""
    p = doc.get("decode_partners_6_1", {}).get("workloads", {}).get(name)
    if not p:
        return ""
    b, sllm = w["systems"]["blitzscale"], w["systems"]["serverlessllm"]
    decode = p["live_batches_by_source_role"].get("decode", 0)
    batches = sum(p["live_batches_by_source_role"].values())
    return (
        " Under P/D each new instance pairs with an overloaded prefill instance and takes "
        "its queue (BlitzScale §5.2: the pair is the overloaded instance and the new one, "
        "'autoscaling a prefill instance in P/D disaggregation'; §5.1 Fig. 11: its K/V 'will "
        "be transferred to the decode instances'). Counterfactual: decode instances as live "
        "partners too, each batch on the least loaded instance, unpaired, decoding those "
        f"requests there (unsourced; surge before 2026-11-29; {decode} of {batches} live "
        "batches): reductions vs S-LLM TTFT "
        f"{w['ttft_reduction_vs_serverlessllm']:.1%} -> "
        f"{1 - p['ttft_mean_s'] / sllm['ttft_mean_s']:.1%}, TBT "
        f"{w['tbt_reduction_vs_serverlessllm']:.1%} -> "
        f"{1 - p['tbt_mean_s'] / sllm['tbt_mean_s']:.1%}, GPU time "
        f"{1 - b['gpu_seconds'] / sllm['gpu_seconds']:.1%} -> "
        f"{1 - p['gpu_seconds'] / sllm['gpu_seconds']:.1%}."
    )


def _in_flight_note(doc: dict, metric: str, now: float) -> str:
    """The 7B counterfactual with the load monitor surge shipped until 2026-11-28 (every
    system of §6.1 on it), for the TTFT (`metric` "ttft") or GPU-time ("gpu") reduction."""
    p = doc.get("in_flight_6_1")
    if not p or "paper_slo" not in p:
        return ""
    what = "TTFT" if metric == "ttft" else "GPU-time"
    key = f"{metric}_reduction_vs_serverlessllm"
    return (
        " Every system runs BlitzScale's §5.3 monitor: prompt tokens waiting, generated "
        "tokens/s and KV use against per-instance bounds profiled from the cost model and "
        "§3's SLO. Counterfactual: the monitor surge shipped until 2026-11-28 "
        f"({p['bound_requests']:.0f} requests in flight per instance, unsourced): "
        f"BlitzScale's {what} reduction vs S-LLM {p['paper_slo'][key]:.1%} at §3's SLO, "
        f"{p['default_slo'][key]:.1%} at the simulator's default 5-s TTFT SLO (now "
        f"{now:.1%})." + (_monitor_shift(doc, p["paper_slo"]) if metric == "ttft" else "")
    )


def _monitor_shift(doc: dict, old: dict) -> str:
    """What the profiled monitor did to each system's 7B TTFT and GPU time, against the
    in-flight monitor at the same SLO."""
    new = doc["ttft_6_1"]["workloads"]["7b-azurecode"]["systems"]
    parts = [
        f"{name} {old['systems'][name]['ttft_mean_s']:.2f} -> {new[name]['ttft_mean_s']:.2f} s "
        f"({new[name]['gpu_seconds'] / old['systems'][name]['gpu_seconds'] - 1:+.0%} "
        "GPU-seconds)"
        for name in ("blitzscale", "serverlessllm")
    ]
    drop = {
        name: 1 - new[name]["ttft_mean_s"] / old["systems"][name]["ttft_mean_s"]
        for name in ("blitzscale", "serverlessllm")
    }
    return (
        " The profiled monitor against the in-flight one at §3's SLO, mean TTFT: "
        + ", ".join(parts)
        + f": both buy shorter queues with GPU time, S-LLM's TTFT falls more "
        f"({drop['serverlessllm']:.0%} vs {drop['blitzscale']:.0%}), so the reduction narrows."
    )


def _peak_note(check: dict | None) -> str:
    """The workload's §6.1 rate check (`blitzscale_eval.peak_check`) as a sentence."""
    if not check:
        return ""
    by = check["by_scale"]
    here = by[f"{check['rate_scale']:g}"]
    note = (
        f" Its rate (x{check['rate_scale']:g}) as §6.1 scales it, 'such that the peak "
        "incoming rate can be handled by all the instances' (no threshold in the paper; "
        f"taken for every workload as: all {check['instances']} always on serve >= "
        f"{check.get('handled_slo_attainment', 1.0):.0%} within §3's SLO): they serve "
        f"{here['slo_attainment']:.1%} (p99 TTFT {here['ttft_p99_s']:.1f} s"
        + (f", {here['requests']} requests" if "requests" in here else "")
        + ")"
    )
    above = [
        f"x{x} {v['slo_attainment']:.1%}" for x, v in by.items() if float(x) > check["rate_scale"]
    ]
    if above:
        note += f", the largest such scale on its grid (at {', '.join(above)})"
    return note + "."


def _miss_cause(w: dict, keepalive_note: str) -> str:
    """Why a §6.1 workload's reduction is off: how often S-LLM missed, and the measured
    bound of S-LLM loading every instance from SSD (`ttft_6_1`'s counterfactual)."""
    sllm = w["systems"]["serverlessllm"]
    miss, loads = sllm["cache_misses"], sllm["cache_misses"] + sllm["cache_hits"]
    deployed = (
        'S-LLM is deployed as the paper deploys it (§6.2: "we follows its default setting, '
        'which uses a 5-minute keep-alive time"; §3 Fig. 4 the same); the paper gives no '
        "host-memory size and runs one model per workload, so nothing sourced makes it miss "
        'more. Its 20-46% misses (§3 Fig. 4) are on BurstGPT, which has "many time ... with '
        "no requests\" (§6.2) and is not in shared/traces (the 70B row is BurstGPT's in the "
        "paper)."
    )
    if miss < 0.2 * loads:
        head = (
            f"S-LLM rarely misses its host cache ({miss} of {loads} loads miss): the trace "
            "never idles a logical host for the 5-min keep-alive, so S-LLM reloads over PCIe "
            "as AllCache does. "
        )
    else:
        head = (
            f"S-LLM misses {miss} of {loads} loads ({miss / loads:.0%}, within §3 Fig. 4's "
            "20-46%), but most requests reach instances it loaded from host memory. "
        )
    ssd = w.get("counterfactual_serverlessllm_ssd_only")
    bound = (
        ""
        if ssd is None
        else " Counterfactual: S-LLM loading every instance from SSD (its host cache never "
        f"holding the model): reduction {w['ttft_reduction_vs_serverlessllm']:.1%} -> "
        f"{ssd['ttft_reduction_vs_serverlessllm']:.1%}."
    )
    return (
        head
        + deployed
        + bound
        + (" " + keepalive_note if keepalive_note else "")
        + (" The 60-s keep-alive and SSD-only are counterfactuals, not the deployment.")
    )
