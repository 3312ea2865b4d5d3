"""`python -m surge.cli` runs the `surge` command."""

from surge.cli.main import main

main()
