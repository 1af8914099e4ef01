"""The `atlas-remote` command (`commands`) and how it prints (`output`): see docs/cli.md."""

from .commands import main

__all__ = ["main"]
