"""``python -m hybrid.train.bench.gpu_check`` (the module docstring of ``gpu_check`` says what it runs)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
