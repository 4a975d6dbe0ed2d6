from exporter.cli import main
from kube.process import exit_now

exit_now(main())
