"""Entry point of ``python -m labctl`` (what ``tests/lab/lab`` runs)."""

import sys

from labctl.cli import main

sys.exit(main())
