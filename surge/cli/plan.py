"""`surge plan ...`: print and draw multicast plans from `surge.policy` (owned by the planning issue)."""

import typer

app = typer.Typer(help="Plan model multicasts and execution pipelines.", no_args_is_help=True)
