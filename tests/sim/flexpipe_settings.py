"""The §9-style simulator settings the FlexPipe simulator tests share (a 20-QPS run of
llama2-7b on the `flexpipe` cluster), shortened per test by overriding `duration_s`."""

from surge.policy.slo import Slo

SECTION9_KW = dict(
    cluster="flexpipe",
    model="llama2-7b",
    rate_rps=20.0,
    duration_s=60.0,
    slo=Slo(ttft_s=5.0, tpot_s=0.2),
    fine_stages=4,
    coarse_stages=1,
    input_tokens=512,
    output_tokens=128,
    seed=1,
)
