"""``python -m launch``: the ``fedsys`` command."""

import sys

from launch.cli import main

sys.exit(main())
