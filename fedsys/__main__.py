import sys

from fedsys.cli import main

sys.exit(main())
