"""`make demo`: runs the pool scenario on local AWS and exits non-zero if its accounting check fails."""

import sys

from emulator import pool_scenario

if __name__ == "__main__":
    sys.exit(0 if pool_scenario.run() else 1)
