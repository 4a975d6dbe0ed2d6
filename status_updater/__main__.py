import logging
import os
import sys

from status_updater.cli import main

code = main()
# Leave without the interpreter's shutdown: daemon threads blocked in a request (a watch, a
# relist during slow answers) can make it abort (exit -6) after the work is done. Flush first.
logging.shutdown()
try:
    sys.stdout.flush()
    sys.stderr.flush()
except (BrokenPipeError, ValueError):  # the reader has gone (`| head`): nothing left to say
    pass
os._exit(code)
