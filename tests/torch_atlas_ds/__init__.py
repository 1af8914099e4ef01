"""A stand-in for the format's original package (torch-atlas-ds): its whole body is the one-line change users
make. tests/format/test_dropin.py imports the original's names from here, as code written for the original does."""

from atlas_remote import *  # noqa: F401,F403
