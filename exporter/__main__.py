from exporter.cli import main
from mig_exporter.common.process import exit_now

exit_now(main())
