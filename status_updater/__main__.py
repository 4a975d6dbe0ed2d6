from mig_exporter.common.process import exit_now
from status_updater.cli import main

exit_now(main())
