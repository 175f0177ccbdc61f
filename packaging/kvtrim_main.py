"""The bundle's entry point: ``kvtrim`` with no arguments opens the app; any
arguments go to the command line (``kvtrim --self-test``, ``kvtrim ask ...``)."""

import multiprocessing
import sys

from app.main import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
