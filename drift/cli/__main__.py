import sys

from drift.cli.main import main

sys.exit(main())
