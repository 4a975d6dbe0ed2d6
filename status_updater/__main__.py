import sys

from status_updater.cli import main

sys.exit(main())
