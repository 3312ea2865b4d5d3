"""`surge model ...`: placeholder until the model store lands."""
import typer

app = typer.Typer(help="Create, import and inspect models.", no_args_is_help=True)
