import sys

from gnnssd.cli import main

sys.exit(main())
