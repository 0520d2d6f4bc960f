"""``python -m fedsys_launch``: the ``fedsys`` command."""

import sys

from fedsys_launch.commands.cli import command

sys.exit(command())
