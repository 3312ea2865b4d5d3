"""The control plane: deployments, autoscaler, parameter pool, scale-outs."""
