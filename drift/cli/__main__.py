"""`python -m drift.cli ...`: the `drift` command (as `python -m drift`)."""

import sys

from drift.cli.main import main

sys.exit(main())
