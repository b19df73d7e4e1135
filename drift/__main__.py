"""`python -m drift ...`: the `drift` command."""

import sys

from drift.cli.main import main

sys.exit(main())
