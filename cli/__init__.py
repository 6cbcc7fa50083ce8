"""The `nmt` command line: thin typer commands over the `nmt` library (installed as nmt_cli)."""
