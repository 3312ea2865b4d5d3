"""The must-hold check of `surge serve --emulate` (`benchmarks/emulation/serve_check.py`): each
scenario reads a counter surge exports, on a preset that holds its nodes, for a strategy
`surge serve` carries out; /metrics' samples are summed over their labels. (The check itself
runs the CLI on a netns cluster for minutes; `tests/runtime/test_netns.py` runs that path
end to end with Ctrl-C on a tiny cluster.)"""

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.emulation.serve_check import SCENARIOS, metric_by_label, metric_sum
from surge.control.metrics import Metrics
from surge.emulation import EmulationConfig
from surge.policy.systems import serve_system


def test_each_scenario_reads_an_exported_counter_on_a_preset_that_holds_it() -> None:
    text = Metrics().render().decode()
    counters = {f.name for f in text_string_to_metric_families(text) if f.type == "counter"}
    assert set(SCENARIOS) == {"lambdascale", "paraserve", "blitzscale", "flexpipe"}
    for strategy, sc in SCENARIOS.items():
        # A renamed counter would read 0 for ever: the check would report no mechanism.
        assert sc.counter.removesuffix("_total") in counters, sc.counter
        assert sc.nodes <= EmulationConfig.parse(sc.emulate, sc.time_dilation).num_gpus
        assert serve_system(strategy).serve
        assert sum(n for _, n in sc.waves) >= 8, strategy  # a burst, not a request


def test_samples_are_summed_over_their_labels() -> None:
    m = Metrics()
    m.emulation_steps.labels("0").inc(3)
    m.emulation_steps.labels("1").inc(4)
    m.emulation_violations.labels("1").inc(1)
    text = m.render().decode()
    assert metric_by_label(text, "surge_emulation_steps_total") == {
        '{node="0"}': 3.0,
        '{node="1"}': 4.0,
    }
    assert metric_sum(text, "surge_emulation_steps_total") == 7.0
    assert metric_sum(text, "surge_emulation_violations_total") == 1.0
    assert metric_sum(text, "surge_pipeline_refactors_total") == 0.0  # no sample yet
