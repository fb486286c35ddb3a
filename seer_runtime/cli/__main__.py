"""``python -m seer_runtime.cli`` = the ``seer`` console script."""

import sys

from . import main

sys.exit(main())
