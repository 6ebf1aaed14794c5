"""``python -m hybrid.train.bench`` = ``hybrid-bench``."""
import sys

from ..cli.bench import bench_main

if __name__ == "__main__":
    sys.exit(bench_main())
