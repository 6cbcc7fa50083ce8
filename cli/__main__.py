"""`python -m nmt_cli` runs the `nmt` command."""

from nmt_cli.main import main

main()
