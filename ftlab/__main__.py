"""``python -m ftlab``: the ``ftlab`` command."""

import sys

from ftlab.cli import main

sys.exit(main())
