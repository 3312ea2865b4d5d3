"""`surge simulate`: the cluster simulator (owned by the simulator issue; being built)."""

import typer

app = typer.Typer(help="Simulate scale-out systems on real traces at cluster scale.")
