"""ftlab's command line (``ftlab``, ``python -m ftlab``): :func:`main` runs it."""

from ftlab.cli.app import main, parser
from ftlab.cli.run import ENV_VARS

__all__ = ["ENV_VARS", "main", "parser"]
