"""Cluster simulator: the same `surge.policy` decisions, executed in virtual time.

Flow: a `Trace` (surge.traces) and `SimSettings` go into `simulator.simulate`; requests
arrive as events on the `EventLoop`; the router, autoscaler, host-cache, placement,
start-up, serve-while-loading, ParaServe and FlexPipe policies of `surge.policy` decide
(`pools`, `scaling`, `loading`, `groups`, `flexpipe`, `host_cache` carry the decisions
out); block transfers and loads run as flows sharing link bandwidth
(`flows.FlowNetwork`); instances serve with a continuous-batching cost model built from
hardware and model profiles (`profiles/*.json`). Out comes a `SimResult` of per-request
latencies and cluster time series, summarised by `metrics`. Systems (λScale, BlitzScale,
ParaServe, FlexPipe and the papers' baselines) are `surge.policy.systems` entries, never
forks of the simulator.
"""
