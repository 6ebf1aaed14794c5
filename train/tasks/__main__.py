"""``python -m hybrid.train.tasks`` = ``hybrid-synthetic``."""
import sys

from ..cli.synthetic import main

sys.exit(main())
