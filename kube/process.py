"""How both daemons' processes end."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Leave without the interpreter's shutdown: daemon threads blocked in a request (a watch, a
    relist during slow answers) can make it abort (exit -6) after the work is done. Flush first."""
    logging.shutdown()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (BrokenPipeError, ValueError):  # the reader has gone (`| head`): nothing left to say
        pass
    os._exit(code)
