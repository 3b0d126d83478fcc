"""Subcommands of the xla-harness CLI, one module each."""
