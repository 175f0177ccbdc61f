"""``python -m engine.cli``: the ``kvtrim`` command without the app's entry point."""

import sys

from .main import main

sys.exit(main())
