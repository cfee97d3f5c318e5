"""Command-line interface: thin commands over the library. Each module registers its commands on
:data:`planner.cli.app.app`; importing this package registers them all."""

from planner.cli.app import app, main  # noqa: F401

# Command modules (one line each; keep sorted).
from planner.cli import catalog  # noqa: F401
from planner.cli import collective  # noqa: F401
from planner.cli import engines  # noqa: F401
from planner.cli import explain  # noqa: F401
from planner.cli import launch  # noqa: F401
from planner.cli import pictures  # noqa: F401
from planner.cli import ps  # noqa: F401
from planner.cli import schema  # noqa: F401
from planner.cli import estimate  # noqa: F401,E402
from planner.cli import plan  # noqa: F401,E402
from planner.cli import goodput  # noqa: F401,E402
from planner.cli import sweep  # noqa: F401,E402
from planner.cli import calibrate  # noqa: F401,E402
from planner.cli import hetero  # noqa: F401,E402
from planner.cli import check  # noqa: F401,E402
