"""``python -m geco.daemon``: run gecod."""

import sys

from geco.daemon import main

sys.exit(main())
