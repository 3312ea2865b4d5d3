"""Pure planning: plain dataclasses in, plans out. No sockets, no torch, no clocks.

What flows through the package (docs/planning.md has the full story):
- `multicast.MulticastRequest` -> `multicast.plan_scale_out` -> `MulticastOutcome`
  (the `plan.Plan`, its `pipelines.Pipeline`s and the `timing.Timeline`);
- strategies: `multicast/binomial` (λScale §3-§4.2), `multicast/chain` (BlitzScale
  §5.1), `multicast/baselines` (binary tree, naive), all over `send_queues` or the
  hypercube, split into `subgroups`;
- `pipelines` + `stage_cover`: execution pipelines and mode switches (λScale §4.3-§4.4);
- `timing`: seconds and lower bounds on a `cluster.Cluster`; `block_count`: choosing B;
- `report` (JSON) and `gantt` (PNG) present an outcome.
"""
