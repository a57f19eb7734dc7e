"""`python -m cli …`: the same entry point as the `chorus` console script (`cli.main:main`)."""

import sys

from cli.main import main

sys.exit(main())
