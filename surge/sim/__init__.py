"""Cluster simulator: the same `surge.policy` decisions, executed in virtual time.

Flow: a `Trace` (surge.traces) and `SimSettings` go into `simulator.simulate`; requests
arrive as events on the `EventLoop`; the router, autoscaler, host-cache and placement
policies of `surge.policy` decide; scale-outs are planned by
`surge.policy.multicast.plan_scale_out` and their block transfers run as flows sharing
link bandwidth (`flows.FlowNetwork`); instances serve with a continuous-batching cost
model built from hardware and model profiles (`profiles/*.json`). Out comes a
`SimResult` of per-request latencies and cluster time series, summarised by `metrics`.
Systems (λScale, BlitzScale, ParaServe, FlexPipe and the papers' baselines) are
configurations of policies (`systems.py`), never forks of the simulator.
"""
