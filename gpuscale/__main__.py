"""`python -m gpuscale …` runs `gpuscale …`."""

import sys

from gpuscale.cli.main import main

sys.exit(main())
