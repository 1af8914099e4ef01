"""`python -m atlas_remote.cli`: the `atlas-remote` command."""

from .main import main

if __name__ == "__main__":
    main()
