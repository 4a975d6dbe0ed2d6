"""Writing a ConfigMap without losing anyone's write: create, or merge-patch at the version seen.

Both of the updater's writers (one ConfigMap, one per node) write this way. Never a PUT: a patch
carries the resourceVersion it was computed from, so the API answers 409 if the object moved
since; a create answers 409 if it exists after all, a patch 404 if it went. Each of those reads
it again and tries again, until what is there is what was wanted, or `attempts` have failed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from mig_exporter.kube.api import REQUEST_TIMEOUT


@dataclass(frozen=True)
class Seen:
    """What a read found: whether it exists, its resourceVersion, and whether there is nothing
    to write (it holds what is wanted already, or it is not ours to touch)."""

    exists: bool
    version: str | None
    done: bool = False


def create_or_patch(
    core: Any,
    namespace: str,
    name: str,
    create: Mapping[str, Any],
    patch: Mapping[str, Any],
    seen: Seen,
    reread: Callable[[], Seen],
    attempts: int,
) -> Any | None:
    """Write the ConfigMap `name`: `create` where it does not exist, else `patch` (its
    `metadata` gets the resourceVersion seen). Returns the API's answer, unread
    (`_preload_content=False`), or None when nothing was written because a read found it done.
    Raises the ApiException of any other failure, or a 409 after `attempts` conflicts."""
    for _ in range(attempts):
        if seen.done:
            return None
        try:
            if not seen.exists:
                return core.create_namespaced_config_map(
                    namespace,
                    cast(Any, create),
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT,
                )
            meta = dict(patch.get("metadata") or {})
            if seen.version:
                meta["resourceVersion"] = seen.version  # 409 if it moved since
            body = {**patch, "metadata": meta} if meta else dict(patch)
            return core.patch_namespaced_config_map(
                name, namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as e:
            if e.status not in (404, 409):
                raise
            seen = reread()
    raise ApiException(status=409, reason=f"conflict on {name} persisted after {attempts} attempts")
