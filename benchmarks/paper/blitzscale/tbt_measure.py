"""BlitzScale §6.1's TBT, measured per request: the mean, and what a system's decodes shared.

§2 (background): decode "is evaluated using time-between-tokens (TBT)"; §6.3 Fig. 17: "all
the metrics reported are average". A request's TBT is its time between tokens after the
first, (done - first token) / (tokens - 1) (`sim.metrics.tpot_s`); the mean is over finished
requests with at least two tokens, as Fig. 17's runs (`blitzscale_figs._measure`) take it.

In: the `SimResult`s of one §6.1 workload (every system on the same trace). Out: plain dicts
for blitzscale_eval.json's `ttft_6_1` (the cause of a TBT miss, read per request).
"""

import numpy as np

from surge.sim.metrics import tpot_s
from surge.sim.result import SimResult

SHORT_TOKENS = 10
"""Outputs under this many tokens: their TBT is mostly the gap to the second token."""
LONG_TOKENS = 50
"""Outputs of at least this many tokens: their TBT is mostly the per-token step."""


def tbt(res: SimResult) -> dict:
    """Mean and p99 TBT of one run (s), the requests it counts, and its prefill -> decode
    mutations (§5.2: a mutated instance stops prefilling and decodes)."""
    per = tpot_s(res)
    return {
        "tbt_mean_s": float(per.mean()) if len(per) else None,
        "tbt_p99_s": float(np.percentile(per, 99)) if len(per) else None,
        "tbt_requests": len(per),
        "mutations": int(sum(c for _, _, k, c in res.scale_events if k == "mutate")),
    }


def handoff_split(res: SimResult) -> dict:
    """Mean TBT (s) split into its parts, each a part of the time from the first token to
    done over (tokens - 1), mean over the requests `tbt` counts, so the parts sum to
    `tbt_mean_s` (`sim.result.Handoffs`): the P/D hand-off's wait with no decode instance
    named, while one served (every one full: the wait for a decode slot) and while none
    did (one loading, dd53dfe); the K/V transfer; the queue on the decode instance until
    its next step; the decode steps after (a re-prefilled request's time before its last
    park too); and, whole, the requests never handed off (decoded where they ran)."""
    ok, _, _ = _decoding(res)
    h = res.handoffs
    n = (res.output_tokens[ok] - 1).astype(float)
    first, done = res.first_token_s[ok], res.done_s[ok]
    handed = (h.handoff_s[ok] >= 0) & (h.decode_joined_s[ok] >= 0)
    parked, named = h.parked_s[ok], h.handoff_s[ok]
    arrived, joined = h.kv_arrived_s[ok], h.decode_joined_s[ok]
    wait = np.where(handed, named - parked, 0.0)
    none_serving = handed & h.parked_without_decode[ok]
    parts = {
        "wait_decode_full_s": np.where(handed & ~none_serving, wait, 0.0),
        "wait_decode_loading_s": np.where(none_serving, wait, 0.0),
        "kv_transfer_s": np.where(handed, arrived - named, 0.0),
        "decode_queue_s": np.where(handed, joined - arrived, 0.0),
        "decode_steps_s": np.where(handed, done - joined + (parked - first), 0.0),
        # never handed off: decoded on the instance that prefilled it (a live batch's source,
        # a mutated instance's queue, a pool with no prefill instance), its steps shared
        # with that instance's prefills (prefill-first)
        "decoded_where_prefilled_s": np.where(handed, 0.0, done - first),
    }
    out = {k: float((v / n).mean()) if len(n) else None for k, v in parts.items()}
    in_place = handed & (named == joined) & (arrived == joined)
    out["handed_off"] = int((handed & ~in_place).sum())
    out["decoded_where_prefilled"] = int((~handed).sum())
    out["waited"] = int((wait > 0).sum())
    out["waited_none_serving"] = int((none_serving & (wait > 0)).sum())
    out["wait_mean_s"] = float(wait[wait > 0].mean()) if (wait > 0).any() else 0.0
    return out


def _decoding(res: SimResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mask of the requests `tpot_s` counts, their decode midpoints, their TBT)."""
    ok = (res.done_s >= 0) & (res.output_tokens > 1)
    mid = (res.first_token_s + res.done_s) / 2
    per = (res.done_s - res.first_token_s) / np.maximum(res.output_tokens - 1, 1)
    return ok, mid, per


def _gpus_at(res: SimResult, times: np.ndarray) -> np.ndarray:
    """GPUs the run held at each time (its `gpu_changes` step function)."""
    if not res.gpu_changes:
        return np.zeros(len(times))
    change_t = np.array([t for t, _ in res.gpu_changes])
    change_n = np.array([n for _, n in res.gpu_changes], dtype=float)
    idx = np.searchsorted(change_t, times, side="right") - 1
    return np.where(idx >= 0, change_n[np.maximum(idx, 0)], 0.0)


def _decoding_at(res: SimResult, ok: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Requests in their decode (first token given, not done) at each time."""
    first = np.sort(res.first_token_s[ok])
    done = np.sort(res.done_s[ok])
    return np.searchsorted(first, times, side="right") - np.searchsorted(done, times, "right")


def paired(blitz: SimResult, other: SimResult) -> dict:
    """Per request on the same trace, BlitzScale against another system: at each request's
    decode midpoint, the GPUs each held and the requests decoding per GPU held; and the mean
    TBT of the requests BlitzScale decoded while holding fewer GPUs than the other, and of
    the rest (a longer BlitzScale TBT from decoding on fewer instances shows as the former),
    of those whose prefill ran live and the rest, and of short and long outputs."""
    ok_b, mid_b, per_b = _decoding(blitz)
    ok_o, mid_o, per_o = _decoding(other)
    both = ok_b & ok_o
    gpus_b = _gpus_at(blitz, mid_b[both])
    gpus_o = _gpus_at(other, mid_o[both])
    load_b = _decoding_at(blitz, ok_b, mid_b[both]) / np.maximum(gpus_b, 1)
    load_o = _decoding_at(other, ok_o, mid_o[both]) / np.maximum(gpus_o, 1)
    fewer = gpus_b < gpus_o
    # requests whose prefill ran cooperatively on a live-scaling target (§4)
    live = np.zeros(len(ok_b), bool)
    live[[i for batch in blitz.live_batches for i in batch.request_ids]] = True
    out = {
        "requests": int(both.sum()),
        "longer_tbt_share": float((per_b[both] > per_o[both]).mean()) if both.any() else None,
        "gpus_while_decoding_mean": [float(gpus_b.mean()), float(gpus_o.mean())],
        "decoding_per_gpu_mean": [float(load_b.mean()), float(load_o.mean())],
    }
    # a TBT is per-token step + the gap to the second token (the P/D hand-off: K/V
    # transfer, the wait for a decode slot) / (tokens - 1): the gap weighs on short outputs
    tokens = blitz.output_tokens[both]
    short = tokens < SHORT_TOKENS
    excess = per_b[both] - per_o[both]
    out["excess_share_short"] = float(excess[short].sum() / excess.sum()) if excess.sum() else None
    groups = (("fewer_gpus", fewer), ("not_fewer_gpus", ~fewer))
    groups += (("live_prefilled", live[both]), ("not_live_prefilled", ~live[both]))
    groups += (("short", short), ("long", tokens >= LONG_TOKENS))
    for key, sel in groups:
        out[key] = {
            "requests": int(sel.sum()),
            "tbt_mean_s": [float(per_b[both][sel].mean()), float(per_o[both][sel].mean())]
            if sel.any()
            else None,
        }
    return out
