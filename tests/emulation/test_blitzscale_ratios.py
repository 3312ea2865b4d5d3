"""BlitzScale §6.1 on the emulation (`benchmarks/emulation/blitzscale.py`): the ratios of
BlitzScale's TTFT to each baseline's, and a first sitting that ran only baselines."""

from benchmarks.emulation.blitzscale import ratios


def test_ratios_to_blitzscale_and_none_before_it_ran() -> None:
    res = {
        "blitzscale": {"ttft_mean_s": 0.5, "ttft_p50_s": 0.4},
        "serverlessllm": {"ttft_mean_s": 1.0, "ttft_p50_s": 0.8},
        "allcache": {"ttft_mean_s": 0.5, "ttft_p50_s": None},
    }
    out = ratios(res)
    assert out["serverlessllm"]["ttft_mean_s"] == 0.5
    assert out["serverlessllm"]["ttft_p50_s"] == 0.5
    assert out["allcache"] == {
        "ttft_mean_s": 1.0,
        "ttft_p50_s": None,
        "ttft_p90_s": None,
        "ttft_p99_s": None,
        "tbt_mean_s": None,
        "tbt_p50_s": None,
    }
    # `--resume` sittings: AllCache alone first; its report has no ratios yet, not a crash
    assert ratios({"allcache": res["allcache"]}) == {}
