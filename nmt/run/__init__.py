"""The run directory as a contract between subcommands: its paths, its lock, atomic writes, the vocabulary identity, recorded splits, and checkpoint files with their names."""
