"""`surge node`: run one node agent (owned by the data-plane issue; being built)."""

import typer

app = typer.Typer(help="Run a node agent (normally started by a launcher).")
