"""python -m pslaunch: psrun (how psstudy starts an installed psrun)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
