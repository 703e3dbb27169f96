"""`python -m recast_cli` runs the CLI (used by `accelerate launch -m recast_cli ...`)."""

from recast_cli.cli import main

main()
