"""Kubernetes JSON: what the updater reads of a Node and a Pod, and the slim copies it keeps.

A cluster holds many times more than placement reads (managedFields, status, other
annotations): the informers slim each object as it arrives (`slim_node`, `slim_pod`), and
`ClusterState` holds only slim objects. A slim object keeps the JSON shape, so every accessor
here reads either form, and reads anything a file may hold without raising: a field of the wrong
type is as if it were not there, or the object's own error where placement reads it.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mig_exporter.common.podlabels import Allowlist
from mig_exporter.kube.times import timestamp
from status_updater import usage
from topology import dra, faults, kai, migparted, runai
from topology.catalog import MIG_SUFFIX
from topology.errors import TopologyError
from topology.model import MIG_STRATEGIES, AllocatedBy
from topology.sharing import GPU_RESOURCE, SHARED_GPU_RESOURCE, base_resource

Obj = Mapping[str, Any]
RELEASED_PHASES = ("Succeeded", "Failed")


def metadata(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def strings(value: object) -> Mapping[str, str]:
    return value if isinstance(value, Mapping) else {}


def node_name(node: Obj) -> str:
    return str(metadata(node).get("name") or "")


def node_created(node: Obj) -> float:
    """When the Node was created, in seconds (never read: infinitely late)."""
    created = timestamp(metadata(node).get("creationTimestamp"))
    return math.inf if created is None else created


def node_uid(node: Obj) -> str | None:
    uid = metadata(node).get("uid")
    return uid if isinstance(uid, str) and uid else None


def names(pod: Obj) -> tuple[str, str]:
    """Namespace and name; a pod from a file may leave its namespace out: kubectl's default."""
    meta = metadata(pod)
    return str(meta.get("namespace") or "default"), str(meta.get("name") or "")


def holder(pod: Obj, container: str) -> AllocatedBy:
    """The pod container holding a device: its names, the pod's uid where it has one (a pod
    from a file may not: then none, as dcgm-exporter's pod_uid is empty for a pod it cannot
    find), and the labels its slim form copies (`pod_slimmer`)."""
    namespace, name = names(pod)
    meta = metadata(pod)
    labels = tuple(sorted(strings(meta.get(COPIED_LABELS)).items()))
    return AllocatedBy(namespace, name, container, str(meta.get("uid") or ""), labels)


def pod_key(pod: Obj) -> str:
    return "/".join(names(pod))


def pod_ref(pod: Obj) -> str:
    return f"pod {pod_key(pod)}"


def is_gpu_node(node: Obj) -> bool:
    return runai.is_gpu_node(strings(metadata(node).get("labels")))


def node_strategy(node: Obj) -> str | None:
    """The node's `nvidia.com/mig.strategy` if it is one (a bad value is the node's own error,
    never what the cluster's topology says)."""
    value = strings(metadata(node).get("labels")).get(runai.LABEL_STRATEGY)
    return value if value in MIG_STRATEGIES else None


def static_layout(node: Obj) -> str | None:
    """The mig-parted layout a static-MIG node is labelled with (None on run:ai dynamic MIG)."""
    labels = strings(metadata(node).get("labels"))
    value = labels.get(migparted.LABEL_CONFIG)
    dynamic = (
        labels.get(runai.LABEL_DYNAMIC_MIG) == "true"
        and labels.get(runai.LABEL_MIG_ENABLED) == "true"
    )
    return value if isinstance(value, str) and value and not dynamic else None


def is_single_strategy(node: Obj) -> bool:
    """GFD's single strategy: `nvidia.com/gpu` counts MIG devices (the GPU operator's default
    strategy, so a product label naming a profile without a strategy label is single too)."""
    strategy = node_strategy(node)
    product = strings(metadata(node).get("labels")).get(runai.LABEL_PRODUCT)
    return strategy == "single" or (strategy is None and MIG_SUFFIX in str(product))


# --- what is kept of each object -----------------------------------------------------------------
# A cluster holds many times more than reconcile reads (managedFields, status, other annotations):
# the caches keep only these, in the same JSON shape, so the code below reads either form.


NODE_LABELS = (runai.LABEL_PRODUCT, runai.LABEL_COUNT, runai.LABEL_MEMORY, runai.LABEL_STRATEGY,
               runai.LABEL_DYNAMIC_MIG, runai.LABEL_MIG_ENABLED, migparted.LABEL_CONFIG,
               *dra.NODE_LABELS)  # fmt: skip
NODE_ANNOTATIONS = (runai.ANNOTATION_MIG_CONFIG, runai.ANNOTATION_MIG_MAPPING, faults.ANNOTATION)
POD_ANNOTATIONS = (
    runai.ANNOTATION_POD_MIG_DEVICE,
    usage.ANNOTATION_UTILIZATION,
    usage.ANNOTATION_FB_USED,
)
POD_LABELS = (usage.LABEL_INFERENCE,)


def _kept(value: object, keys: Iterable[str]) -> dict[str, Any]:
    """These keys' values as they are: an annotation that is no string is its object's error."""
    found = strings(value)
    return {k: found[k] for k in keys if k in found}


def _only(value: object, keys: Iterable[str]) -> dict[str, Any]:
    """These keys' values as label text (see _label_text)."""
    found = strings(value)
    return {k: text for k in keys if k in found and (text := _label_text(found[k])) is not None}


def _label_text(value: object) -> str | None:
    """A label value as the API holds it, a string. A file may hold YAML's
    `true` or `8` unquoted (kubectl would refuse it): read as the text it stands for. Anything
    else (a list, null, a float) is no value: as if the key were not there."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and abs(value) < 10**18:
        return str(value)
    return None


def slim_node(node: Obj) -> dict[str, Any]:
    meta = metadata(node)
    slim: dict[str, Any] = {
        "kind": "Node",
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "creationTimestamp": meta.get("creationTimestamp"),
            # Not only the labels the devices are read from: a fault policy may select nodes by
            # any of them.
            "labels": _all_labels(meta.get("labels")),
            "annotations": _kept(meta.get("annotations"), NODE_ANNOTATIONS),
        },
    }
    advertised = advertised_migs(node)
    if advertised:
        slim["status"] = {"allocatable": advertised}
    return slim


# Node Feature Discovery's labels are the bulk of a GPU node's (a hundred CPU flags and kernel
# facts), and no fault policy picks GPUs by them: not kept.
_UNKEPT_LABELS = "feature.node.kubernetes.io/"


def _all_labels(value: object) -> dict[str, str]:
    """A node's labels but NFD's, interned: thousands of nodes share most keys and values."""
    return {
        sys.intern(k): sys.intern(text)
        for k, v in strings(value).items()
        if isinstance(k, str)
        and not k.startswith(_UNKEPT_LABELS)
        and (text := _label_text(v)) is not None
    }


def node_labels(node: Obj) -> Mapping[str, str]:
    return strings(metadata(node).get("labels"))


def advertised_migs(node: Obj) -> dict[str, str]:
    """The `nvidia.com/mig-<profile>` resources the device plugin advertises (allocatable, or
    capacity where a simulated node sets only that), and the renamed shared `nvidia.com/gpu.shared`."""
    status = node.get("status")
    status = status if isinstance(status, Mapping) else {}
    for key in ("allocatable", "capacity"):
        found = {
            k: str(v)
            for k, v in strings(status.get(key)).items()
            if isinstance(k, str)
            and (k.startswith(runai.MIG_RESOURCE_PREFIX) or k == SHARED_GPU_RESOURCE)
        }
        if found:
            return found
    return {}


DRA_REFS = "dra-refs"  # in a slim pod: the DRA claims its containers use (claim_refs)


COPIED_LABELS = "copiedLabels"  # in a slim pod's metadata: the labels the topology carries


def pod_slimmer(copy_labels: Allowlist | None) -> Callable[[Obj], dict[str, Any]]:
    """What the Pod informer keeps of a pod: `slim_pod`, and with `copy_labels` (--pod-labels)
    the labels it lets through, for the topology's holders."""
    if copy_labels is None:
        return slim_pod

    def slim(pod: Obj) -> dict[str, Any]:
        out = slim_pod(pod)
        labels = {
            k: v for k, v in strings(metadata(pod).get("labels")).items() if isinstance(v, str)
        }
        out["metadata"][COPIED_LABELS] = copy_labels.keep(labels)
        return out

    return slim


def slim_pod(pod: Obj) -> dict[str, Any]:
    """What placement reads of a pod: of each container that can hold a device (`containers`),
    its name, its GPU limits and (an init container) whether it is a sidecar."""
    meta = metadata(pod)
    labels = strings(meta.get("labels"))
    spec = strings(pod.get("spec"))
    status = pod.get("status")
    kept: dict[str, list[dict[str, Any]]] = {"containers": [], "initContainers": []}
    for key, i, c in _every_container(spec):
        if len(kept[key]) < i:  # one that is no object: as if there, so that indices hold
            kept[key] += [{}] * (i - len(kept[key]))
        limits = strings(c.get("resources")).get("limits")
        container = {"name": c.get("name"), "resources": {"limits": {
            k: v for k, v in strings(limits).items() if is_gpu_resource(k)}}}  # fmt: skip
        if key == INIT_CONTAINERS and is_sidecar(c):
            container["restartPolicy"] = c["restartPolicy"]
        kept[key].append(container)
    slim_spec: dict[str, Any] = {"nodeName": spec.get("nodeName"), "containers": kept["containers"]}
    if kept["initContainers"]:
        slim_spec["initContainers"] = kept["initContainers"]
    slim: dict[str, Any] = {
        "kind": "Pod",
        "metadata": {
            **{k: meta.get(k) for k in ("name", "namespace", "uid", "creationTimestamp")},
            "labels": _only(labels, (*POD_LABELS, *kai.kept_labels(labels))),
            "annotations": _kept(meta.get("annotations"), POD_ANNOTATIONS)
            | kai.kept_annotations(strings(meta.get("annotations"))),
        },
        "spec": slim_spec,
        "status": {"phase": status.get("phase") if isinstance(status, Mapping) else None},
    }
    if asks_for_devices(pod):
        slim[DRA_REFS] = claim_refs(pod)
    return slim


# --- containers ----------------------------------------------------------------------------------
# Every container that can hold a device: the init containers and the app containers (ephemeral
# containers have no resources). The kubelet hands them devices in this order (its device
# manager's `Allocate`): a regular init container runs to its end before the next starts, so its
# devices are reusable by the containers after it; a sidecar (an init container with
# `restartPolicy: Always`, GA in Kubernetes 1.33) runs beside the app containers, so its devices
# are its own, as an app container's are (placement.kubelet).

INIT_CONTAINERS = "initContainers"
INIT, SIDECAR, APP = "init", "sidecar", "app"  # a container's kind


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """An init container that restarts (`restartPolicy: Always`): it runs beside the app
    containers for the pod's life (Kubernetes' `IsRestartableInitContainer`)."""
    return container.get("restartPolicy") == "Always"


def _every_container(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """(`initContainers` or `containers`, index, container) of each container, in the order the
    kubelet allocates their devices: the init containers, then the app containers."""
    for key in (INIT_CONTAINERS, "containers"):
        found = spec.get(key)
        for i, c in enumerate(found if isinstance(found, list) else []):
            if isinstance(c, Mapping):
                yield key, i, c


def containers(pod: Obj) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(field, kind, container) of each container that can hold a device, in the kubelet's
    order: `spec.initContainers[0]`, `init` or `sidecar`; then `spec.containers[0]`, `app`."""
    for key, i, c in _every_container(strings(pod.get("spec"))):
        kind = APP if key == "containers" else SIDECAR if is_sidecar(c) else INIT
        yield f"spec.{key}[{i}]", kind, c


def _items(value: object) -> list[Mapping[str, Any]]:
    """A list's objects; anything else in it, or no list, is as if it were not there."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def claim_refs(pod: Obj) -> list[dict[str, str]]:
    """Which ResourceClaim each container uses: `container`, `claim` (the pod's entry resolved
    to the claim's name: its own, or the one made from a template, which `status.
    resourceClaimStatuses` gives once made; or the one made for its extended resources) and
    `request` ("" for all of the claim's)."""
    spec = strings(pod.get("spec"))
    status = strings(pod.get("status"))
    made = {
        str(s.get("name")): str(s["resourceClaimName"])
        for s in _items(status.get("resourceClaimStatuses"))
        if s.get("resourceClaimName")
    }
    claim_of: dict[str, str] = {}
    for entry in _items(spec.get("resourceClaims")):
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            claim_of[name] = str(entry["resourceClaimName"])
        elif name in made:
            claim_of[name] = made[name]
    return [*_named_refs(spec, claim_of), *_extended_refs(status)]


def _extended_refs(status: Mapping[str, Any]) -> list[dict[str, str]]:
    """A container's `nvidia.com/gpu` served through DRA (the DeviceClass's
    `extendedResourceName`, the DRAExtendedResource gate): the scheduler made a claim for the
    pod, and maps each container's resource to one of its requests."""
    extended = strings(status.get("extendedResourceClaimStatus"))
    claim = extended.get("resourceClaimName")
    if not claim:
        return []
    return [
        {
            "container": str(m.get("containerName", "")),
            "claim": str(claim),
            "request": str(m.get("requestName") or ""),
            "extended": "true",
        }
        for m in _items(extended.get("requestMappings"))
    ]


def _named_refs(spec: Mapping[str, Any], claim_of: Mapping[str, str]) -> list[dict[str, str]]:
    """A regular init container's refs are marked `init`: it has ended once the app containers
    run, so it holds a device only where no other container of the pod uses it (`claims.holds`)."""
    return [
        {
            "container": str(c.get("name", "")),
            "claim": claim_of[named],
            "request": str(used.get("request") or ""),
            **({"init": "true"} if key == INIT_CONTAINERS and not is_sidecar(c) else {}),
        }
        for key, _, c in _every_container(spec)
        for used in _items(strings(c.get("resources")).get("claims"))
        if (named := str(used.get("name", ""))) in claim_of
    ]


# --- pods ----------------------------------------------------------------------------------------


def may_hold_gpu(pod: Obj) -> bool:
    """Whether the pod can hold a device now: placed, not finished, asking for a MIG device or GPUs.

    Only these are kept: on a real cluster most pods never touch a GPU.
    """
    meta = metadata(pod)
    annotations = strings(meta.get("annotations"))
    # A request for no device (`0`) holds nothing; any other, odd ones included, is kept: an
    # odd one to be said. A pod naming DRA claims may hold what they are allocated, a KAI
    # fraction pod a share of its GPU group's.
    return holds_gpu(pod) and (
        runai.ANNOTATION_POD_MIG_DEVICE in annotations
        or kai.is_fraction(names(pod)[0], strings(meta.get("labels")), annotations)
        or any(device_count(value) != 0 for *_, value in gpu_limits(pod))
        or asks_for_devices(pod)
        or DRA_REFS in pod
    )


def asks_for_devices(pod: Obj) -> bool:
    """The pod (not slimmed) names DRA claims, whether or not they are allocated yet, or the
    scheduler made one for its extended resources."""
    spec = pod.get("spec")
    claims = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    status = strings(pod.get("status"))
    return (isinstance(claims, list) and bool(claims)) or bool(
        strings(status.get("extendedResourceClaimStatus"))
    )


def pod_node(pod: Obj) -> str | None:
    spec = pod.get("spec")
    name = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return str(name) if name else None


def holds_gpu(pod: Obj) -> bool:
    """A pod placed on a node holds its device until it has Succeeded or Failed (or is deleted).

    Pending (being started) and Unknown (kubelet unreachable) pods keep it: run:ai does too.
    """
    status = pod.get("status")
    phase = status.get("phase") if isinstance(status, Mapping) else None
    return phase not in RELEASED_PHASES and pod_node(pod) is not None


def first_container(pod: Obj) -> str:
    spec = pod.get("spec")
    containers = spec.get("containers") if isinstance(spec, Mapping) else None
    if isinstance(containers, list) and containers and isinstance(containers[0], Mapping):
        return str(containers[0].get("name", ""))
    return ""


def is_gpu_resource(name: object) -> bool:
    """`nvidia.com/gpu`, `nvidia.com/mig-<profile>`, or either renamed for sharing (`.shared`)."""
    return isinstance(name, str) and (
        base_resource(name) == GPU_RESOURCE or name.startswith(runai.MIG_RESOURCE_PREFIX)
    )


QUANTITY = re.compile(r"[0-9]{1,6}")  # a device count; more than a million is no real request


def gpu_limits(pod: Obj) -> Iterator[tuple[str, str, str, str, object]]:
    """(field, kind, container name, resource, value) of each GPU or MIG resource limit of each
    container that can hold a device (`containers`), in the kubelet's order."""
    for field, kind, c in containers(pod):
        limits = strings(c.get("resources")).get("limits")
        for resource, value in sorted(strings(limits).items()):
            if is_gpu_resource(resource):
                yield field, kind, str(c.get("name", "")), str(resource), value


def device_count(value: object) -> int | None:
    """A device count as the API writes one (decimal digits), or None."""
    text = value if isinstance(value, str) else str(value) if isinstance(value, int) else ""
    return int(text) if QUANTITY.fullmatch(text) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Ask:
    """One container's request for devices of one resource (extended resources are whole
    numbers, their limit the request)."""

    field: str  # where the container is: `spec.initContainers[0]`
    kind: str  # INIT, SIDECAR or APP
    container: str
    resource: str
    count: int


def requests(pod: Obj) -> list[Ask]:
    """Each GPU or MIG resource the pod's containers ask for, in the kubelet's order."""
    return [
        Ask(field=field, kind=kind, container=name, resource=resource, count=count)
        for field, kind, name, resource, value in gpu_limits(pod)
        if (count := device_count(value))
    ]


def odd_requests(pod: Obj) -> list[tuple[str, str, object]]:
    """(container's field, resource, value) of each GPU or MIG resource asked for in something
    other than a whole number of devices (`1.5`, `500m`, `-1`): the API refuses such a pod, so
    one comes only from a file or an emulator, and is said, never silently left out."""
    return [(f, r, v) for f, _, _, r, v in gpu_limits(pod) if device_count(v) is None]


def shown(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10**30 else "a huge number"
    return text if len(text) <= 40 else f"{text[:37]}..."


def mig_profile(resource: str) -> str | None:
    """The MIG profile a resource asks for (`nvidia.com/mig-1g.5gb` -> `1g.5gb`); None for
    `nvidia.com/gpu`, which under the single strategy is an instance of any profile."""
    return None if resource == GPU_RESOURCE else resource.removeprefix(runai.MIG_RESOURCE_PREFIX)


def pod_order(pod: Obj) -> tuple[float, str, str]:
    """Older pods first (by time, not by text: writers format timestamps differently); a pod
    without a readable timestamp after all others."""
    meta = metadata(pod)
    created = timestamp(meta.get("creationTimestamp"))
    return (
        math.inf if created is None else created,
        str(meta.get("namespace", "")),
        str(meta.get("name", "")),
    )


def pod_uid(pod: Obj) -> str:
    meta = metadata(pod)
    return str(meta.get("uid") or pod_key(pod))


def annotation(annotations: Mapping[str, object], key: str, obj: str) -> str | None:
    value = annotations.get(key)
    if value is not None and not isinstance(value, str):
        raise TopologyError(
            obj, f"metadata.annotations[{key}]", f"expected a string, got {value!r}"
        )
    return value
