"""benchmarks/paper/lambdascale/: λScale's REPORT.md rows judged as the paper states them.

Fig. 10 against its open-topped "2× to over 4×", §7.5's multi-model row on the median of
its fixed seeds, §1's p90 tail latency (Fig. 15), §2.3's SSD load bound, Fig. 13 on every
one of the k nodes, Fig. 16 on the throughput ramp and its token rate per k, and Fig. 7's
"up to" over the figure's three tests. How rows are judged and rendered in general is
`test_paper_report.py`'s.
"""

import json
import sys
from pathlib import Path

PAPER_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "paper"
sys.path.insert(0, str(PAPER_DIR))
sys.path.insert(0, str(PAPER_DIR / "lambdascale"))

import lambdascale_bursts  # noqa: E402
import lambdascale_figs_rows as figs_rows  # noqa: E402
import lambdascale_kway as kway  # noqa: E402
import lambdascale_multi as multi  # noqa: E402
import lambdascale_traces as traces  # noqa: E402
import reproduce  # noqa: E402
from rows import NO_TOP  # noqa: E402


def test_lambdascale_fig10_is_judged_per_model_against_an_open_top() -> None:
    """Every model's ramp ratio (at the derived start) must reach 2x less 20%; none caps it."""

    def fig10(ratios: tuple[float, ...]) -> dict:
        models = {
            m: {"ramp_ratio": 1.5, "ramp_ratio_init0": 1.0, "ramp_ratio_fig12start": r}
            for m, r in zip(("llama2-7b", "llama2-13b", "llama2-70b"), ratios, strict=True)
        }
        return {"models": models, "serverlessllm_start_s": 3.0}

    assert figs_rows.FIG10_RANGE == (2.0, NO_TOP)
    assert "2× to over 4×" in figs_rows.FIG10_QUOTE
    assert figs_rows.fig10_row(fig10((6.0, 3.5, 3.38)))["within_20"] is True
    assert figs_rows.fig10_row(fig10((6.0, 1.42, 3.38)))["within_20"] is False
    # at start 0 the ratios are 1.00x: the cause must not say λScale still leads there
    cause = figs_rows.fig10_row(fig10((6.0, 3.5, 3.38)))["cause"]
    assert "at 0 λScale still leads" not in cause
    assert "The ordering rests on it too" in cause


def test_lambdascale_multi_row_is_judged_on_the_median_seed_and_orders_at_every_seed() -> None:
    """§7.5's ratio is one draw per seed: the row takes the median of the fixed seeds (one
    high seed does not move it), and the ordering must hold at each of them."""
    assert len(multi.MULTI_SEEDS) % 2 == 1 and multi.MULTI_SEEDS[0] == 0

    def doc(heads: tuple[float, ...], faasnet: float = 6.0) -> dict:
        ratios = {k: 3.0 for k in multi.JUDGED} | {"faasnet": faasnet}
        return {
            "seeds": {
                str(i): {
                    "tail_ttft_ratio": ratios | {"serverlessllm-fig12start": h},
                    "sllm_fig12start_cache_misses": 80,
                }
                for i, h in enumerate(heads)
            }
        }

    held = multi.multi_row(doc((4.5, 5.2, 9.0)))
    assert held["within_20"] is True and held["ordering"] is True
    assert "5.20x (4.50-9.00)" in held["simulator"]
    assert multi.multi_row(doc((6.5, 7.0, 4.6)))["within_20"] is False
    assert multi.multi_row(doc((4.5, 5.2, 0.9)))["ordering"] is False


def test_lambdascale_tail_latency_is_the_90th_percentile() -> None:
    """λScale §1: "a 2.4x to 5x improvement in 90th tail latency" (FaaScale §1: "P90
    TTFT"): the multi-model row's ratios are p90 TTFTs, not p99; Fig. 15 is judged against
    §1's range."""
    res = {
        k: {"ttft_p90_s": 2.0, "ttft_p99_s": 9.0}
        for k in ("lambdascale", *multi.JUDGED, "serverlessllm-fig12start")
    }
    res["lambdascale"] = {"ttft_p90_s": 1.0, "ttft_p99_s": 1.0}
    res["serverlessllm-fig12start"] = {"ttft_p90_s": 2.0, "ttft_p99_s": 9.0, "cache_misses": 3}
    summary = multi.seed_summary(10, res)
    assert set(summary["tail_ttft_ratio"].values()) == {2.0}
    assert set(summary["p99_ttft_ratio"].values()) == {9.0}
    doc = json.loads(
        (PAPER_DIR.parent / "results" / "paper" / "lambdascale_traces.json").read_text()
    )
    fig15 = next(r for r in traces.report_rows(doc) if r["figure"] == "Fig. 15")
    assert fig15["paper_value"] == "2.4x-5x" and "p90 TTFT" in fig15["simulator"]
    assert fig15["within_20"] is not None  # judged against §1's range, not ordering only


def test_lambdascale_ssd_load_bound_leaves_seconds_beyond_the_read() -> None:
    """λScale §2.3: 70B from SSD "takes over 30 seconds" on its testbed; Table 1's 5-GB/s
    read is 27.6 s of it, so more than 2.4 s goes elsewhere (above the shipped 0.5-s start)."""
    floor = lambdascale_bursts.sllm_start_floor_s()
    assert 2.0 < floor < 3.0


def test_lambdascale_fig13_loads_on_every_one_of_the_k_nodes() -> None:
    """λScale §7.4 runs Fig. 13 "under the same setup used in Fig. 10": R = 4 nodes serve
    and all k = 8 others load from host memory (§7.3, N = R + k), not only the 3 the
    50-request burst would ask the autoscaler for."""
    doc = lambdascale_bursts.fig13()
    assert doc["local_loads"] == 8
    assert {v["cache_hits"] for v in doc["systems"].values()} == {8}


def test_lambdascale_fig16_is_judged_on_the_throughput_ramp_not_ttft() -> None:
    """λScale §7.6 Fig. 16 ("Impacts of k-way transmission on throughput performance"):
    k=4 "achieves the fastest scaling", k=1 "the slowest scaling and the lowest overall
    throughput". The row reads the ramp and the overall throughput; mean TTFT (what it read
    before) cannot make it hold or miss."""

    def doc(ramp: tuple, tput: tuple, ttft: tuple) -> dict:
        systems = {
            f"k{k}": {
                "ramp_s": r,
                "ramp_by_share_s": {"20%": r / 3, "50%": r / 2, "80%": r},
                "mean_tokens_per_s": m,
                "ttft_mean_s": t,
                "first_pipeline_s": r / 4,
                "last_token_s": 2.0,
                "ttft_cdf_s": [0.1, 1.0],
            }
            for k, r, m, t in zip((1, 2, 4), ramp, tput, ttft, strict=True)
        }
        return {"systems": systems}

    fast_ttft_flat_ramp = kway.fig16_row(doc((1.3, 1.3, 1.3), (100, 100, 100), (1.1, 1.0, 0.9)))
    assert fast_ttft_flat_ramp["ordering"] is False
    assert "ramp to 80%" in fast_ttft_flat_ramp["simulator"]
    ramp_holds = kway.fig16_row(doc((1.3, 0.9, 0.5), (90, 100, 110), (0.9, 1.0, 1.1)))
    assert ramp_holds["ordering"] is True
    slowest_but_not_lowest = kway.fig16_row(doc((1.3, 0.9, 0.5), (120, 100, 110), (1, 1, 1)))
    assert slowest_but_not_lowest["ordering"] is False


def test_lambdascale_fig16_measures_a_token_rate_per_k() -> None:
    """The Fig. 16 run yields each k's token rate over time and its ramp time."""
    doc = kway.fig16()
    for k in ("k1", "k2", "k4"):
        v = doc["systems"][k]
        assert len(v["rate_curve"]) > 10 and max(v["rate_curve"]) > 0
        assert 0 < v["ramp_s"] <= v["last_token_s"]


def test_lambdascale_fig7_up_to_is_over_the_figures_three_tests() -> None:
    """FaaScale Fig. 7's caption: the 4-node 70B, 8-node 7B and 12-node 13B tests; a case
    outside them (13B on 8 nodes) does not set the "up to"."""
    assert set(reproduce.FIG7_CASES) == {("llama2-7b", 8), ("llama2-13b", 12), ("llama2-70b", 4)}
    rows = [
        {"model": "llama2-7b", "nodes": 8, "lambdascale": 1.0, "faasnet": 1.5, "nccl": 1.2},
        {"model": "llama2-13b", "nodes": 12, "lambdascale": 1.0, "faasnet": 1.8, "nccl": 1.5},
        {"model": "llama2-13b", "nodes": 8, "lambdascale": 1.0, "faasnet": 3.0, "nccl": 3.0},
        {"model": "llama2-70b", "nodes": 4, "lambdascale": 1.0, "faasnet": 1.6, "nccl": 1.1},
    ]
    assert reproduce.fig7_max(rows, "faasnet") == 1.8
    assert reproduce.fig7_max(rows, "nccl") == 1.5
