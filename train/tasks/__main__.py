"""``python -m hybrid.train.tasks`` = ``hybrid-synthetic``."""
import sys

from .cli import main

sys.exit(main())
