"""`python -m orchestrator.cli` runs the `ablate` command (where the console script is not installed)."""

from orchestrator.cli import main

main()
