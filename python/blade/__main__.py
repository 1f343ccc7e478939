"""The `blade` command line (also `python -m blade`); see `blade --help`."""
import sys

from blade.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
