"""``python -m jobqueue.cli``."""

import sys

from jobqueue.cli.core import main

sys.exit(main())
