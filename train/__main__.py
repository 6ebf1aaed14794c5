"""``python -m hybrid.train`` = ``hybrid-train`` (also under ``torchrun -m hybrid.train``)."""
import sys

from .cli.lm import train_main

if __name__ == "__main__":
    sys.exit(train_main())
