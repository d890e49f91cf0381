"""`make demo`: the whole system on local AWS plays the demo scenario; non-zero if its accounting fails."""

import sys

from emulator import demo

if __name__ == "__main__":
    sys.exit(0 if demo.run(sys.argv[1:]) else 1)
