"""``python -m jobqueue.cli``."""

import sys

from jobqueue.cli.root import main

sys.exit(main())
