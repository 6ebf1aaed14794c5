"""``python -m hybrid.train.distill`` = ``hybrid-distill`` (also under ``torchrun -m hybrid.train.distill``)."""
import sys

from ..cli.distill import main

if __name__ == "__main__":
    sys.exit(main())
