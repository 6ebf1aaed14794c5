"""``python -m hybrid.train.bench`` = ``hybrid-bench``."""
import sys

from .cli import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())
