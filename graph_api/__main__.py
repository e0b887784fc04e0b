"""``python -m graph_api``: the ``graph-api`` command line (see :mod:`graph_api.cli`)."""
import sys

from .cli import main

sys.exit(main())
