"""``python -m ftlab.cli``: the same command as ``ftlab``."""

import sys

from ftlab.cli import main

sys.exit(main())
