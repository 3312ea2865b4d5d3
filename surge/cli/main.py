"""Entry point of the `surge` console command.

Each command group lives in its own module and is mounted here. Heavy imports (torch)
happen inside commands, so `surge --help` and `surge plan` stay fast. A `SurgeError`
becomes a one-line `error: ...` on stderr with exit code 2, never a traceback.
"""

import gc
import logging
import sys

import typer

from surge.cli import dashboard as dashboard_cmd
from surge.cli import deploy as deploy_cmds
from surge.cli import generate, model, node, plan, simulate
from surge.cli import serve as serve_cmd
from surge.errors import SurgeError

app = typer.Typer(
    name="surge",
    help="surge: serverless LLM serving that scales out in under a second and serves "
    "while the model is still arriving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        import surge

        typer.echo(f"surge {surge.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """surge: serverless LLM serving that scales out in under a second and serves while the
    model is still arriving."""


app.add_typer(model.app, name="model")
app.add_typer(plan.app, name="plan")
app.command("simulate")(simulate.simulate)
app.add_typer(node.app, name="node")
app.command("generate")(generate.generate)
app.command("serve")(serve_cmd.serve)
app.command("deploy")(deploy_cmds.deploy)
app.command("status")(deploy_cmds.status)
app.command("delete")(deploy_cmds.delete)
app.command("dashboard")(dashboard_cmd.dashboard)


def main() -> None:
    """Run the CLI, turning user errors into a one-line message and exit code 2."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except SurgeError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    finally:
        # The interpreter's last full collection at exit walks every object torch's import
        # made: ~0.3 s of CPU per process that imported it (each node agent, `surge serve`,
        # `surge generate`), spent after the work is done. Frozen objects are not walked.
        gc.freeze()
