"""The `atlas-remote` command (`commands`) and how it prints (`output`): see docs/cli.md."""

from .main import main

__all__ = ["main"]
