"""``python -m infra.kafka …``: see :mod:`infra.kafka.cli`."""

import sys

from infra.kafka.cli import main

sys.exit(main())
