"""What an exporter's `/health` says, and what it logs on the way there.

Every exporter (one node, `--all-nodes`, `--source nvml`) keeps its problems here by key: what
reports a problem (a watch, a source, NVML) is what clears it when it is good again, so one that
recovers never hides another's. Each change of a problem is logged once, in one line; the same
problem reported again (a resync, a relist) is neither logged nor counted again. Invalid inputs
are counted once per problem in `mig_exporter_invalid_objects_total`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from mig_exporter.common.selfmetrics import InvalidObjects, kind_of
from topology.errors import TopologyError

log = logging.getLogger("exporter")


class Health:
    def __init__(self, first: Mapping[str, str] | None = None, *, every: bool = False) -> None:
        """`first`: the problems true before anything is read (not logged: nothing happened).
        `every`: `/health` names every problem, in key order, rather than the first and how many
        more; for an exporter with a few keys, where each says something different."""
        self._lock = threading.Lock()  # set by sources' threads, read by the render loop
        self._problems: dict[str, str] = dict(first or {})
        self._counted: dict[str, TopologyError] = {}  # key -> the last invalid input counted
        self._every = every
        self.invalid = InvalidObjects("mig_exporter_invalid_objects_total")

    def set(self, key: str, reason: str, *, quiet: bool = False) -> None:
        """`key` has a problem; a new one is logged unless `quiet` (its caller said it)."""
        with self._lock:
            before = self._problems.get(key)
            self._problems[key] = reason
        if reason != before and not quiet:
            log.warning("%s", reason)

    def clear(self, key: str, said: str | None = None) -> bool:
        """`key` is good (again); `said` is logged if it had a problem. Whether it had one."""
        with self._lock:
            had = self._problems.pop(key, None) is not None
        if had and said:
            log.info("%s", said)
        return had

    def has(self, key: str) -> bool:
        with self._lock:
            return key in self._problems

    def count(self, key: str, e: TopologyError) -> bool:
        """Count an invalid input once: whether it is news for `key` (and was counted)."""
        with self._lock:
            if self._counted.get(key) == e:
                return False
            self._counted[key] = e
        self.invalid.count(kind_of(e.obj))
        return True

    def uncount(self, key: str) -> None:
        """`key`'s input is good again: its next problem is news, even the same one."""
        with self._lock:
            self._counted.pop(key, None)

    def state(self) -> tuple[bool, str]:
        """(healthy, the reason `/health` gives): `ok`, or the problems in one line."""
        with self._lock:
            problems = dict(self._problems)
        if not problems:
            return True, "ok"
        if self._every:
            return False, "; ".join(problems[key] for key in sorted(problems))
        # Sorted, so the line is the same whichever source reported first.
        reasons = sorted(problems.values())
        more = f" (and {len(reasons) - 1} more problems)" if len(reasons) > 1 else ""
        return False, reasons[0] + more
