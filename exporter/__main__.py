from common.process import exit_now
from exporter.cli import main

exit_now(main())
