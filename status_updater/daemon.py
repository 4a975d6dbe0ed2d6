"""`python -m status_updater run`: the informers, the elector and the writer, wired together."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import kubernetes

from mig_exporter.common import selfmetrics
from mig_exporter.common.podlabels import Allowlist
from mig_exporter.kube.api import ConfigError, Pace, api_client, paced
from mig_exporter.web.listen import host_port
from mig_exporter.web.server import MetricsServer, Published, Snapshot
from status_updater.claimstatus import ClaimStatusWriter
from status_updater.controller import Controller, Writer
from status_updater.dra import DraOptions
from status_updater.leader import CLIENT_GO, LeaderElector, Timing
from status_updater.pernode import PerNodeWriter
from status_updater.single import SingleWriter
from status_updater.slicewriter import SliceWriter, WithSlices
from topology.settings import topology_name, topology_namespace

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2
WATCHDOG_S = 1.0  # how often the main thread checks that every loop still runs
# How long the writer's loop may go without a turn before `/health` calls it stuck: past the
# longest a busy turn can take (a pass's last write: five tries of a 30-s request, and the
# re-reads), so that a busy writer is never called stuck, and a hung one is.
WRITER_STUCK_S = 600.0
log = logging.getLogger("status_updater")


def run(
    kubeconfig: str | None,
    layout: str,
    lease_name: str,
    identity: str,
    resync_s: float,
    mig_parted_config: str,
    metrics: tuple[str, int] | None = None,
    dra: DraOptions | None = None,
    pace: Pace | None = None,
    timing: Timing = CLIENT_GO,
    pod_labels: Allowlist | None = None,
    node_labels: bool = False,
    kai_selector: str | None = None,
) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        client = api_client(kubeconfig)
        # The Lease has a client of its own, never paced behind the writes (as
        # kube-controller-manager's leader election has): it is renewed however busy they are.
        lease_client = api_client(kubeconfig)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if pace is not None:
        paced(client, pace)
    writer, controller, elector = _components(
        client, layout, lease_name, identity, resync_s, mig_parted_config, dra, lease_client,
        timing, pod_labels, node_labels, kai_selector,
    )  # fmt: skip
    stop = threading.Event()

    def shutdown(*_: object) -> None:
        stop.set()
        controller.dirty.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, shutdown)
    writer_thread = threading.Thread(
        target=controller.run_writer, args=(stop,), name="writer", daemon=True
    )
    elect = threading.Thread(target=elector.run, args=(stop,), name="elector", daemon=True)
    published = Published()
    server = None
    if metrics is not None:
        try:
            server = MetricsServer(published, *metrics)
        except OSError as e:
            where = host_port(*metrics)
            print(f"error: cannot listen on {where}: {e.strerror}", file=sys.stderr)
            return EXIT_USAGE
        server.start()
    threads = (*controller.informers(stop), elect, writer_thread)
    for t in threads:
        t.start()
    log.info("running as %s: %s layout, %s, lease %s", identity, layout, writer.what, lease_name)
    code = _supervise(threads, controller, elector, published, stop)
    if code != EXIT_OK:
        return code
    # SIGTERM: a write in flight gets a moment to land (a PATCH lands whole or not at all), then
    # the Lease is released so a standby takes over at once. Watches are daemon threads.
    writer_thread.join(timeout=1.0)
    elector.release()
    if server is not None:
        server.stop()
    return EXIT_OK


def _components(
    client: kubernetes.client.ApiClient,
    layout: str,
    lease_name: str,
    identity: str,
    resync_s: float,
    mig_parted_config: str,
    dra: DraOptions | None = None,
    lease_client: kubernetes.client.ApiClient | None = None,
    timing: Timing = CLIENT_GO,
    pod_labels: Allowlist | None = None,
    node_labels: bool = False,
    kai_selector: str | None = None,
) -> tuple[Writer, Controller, LeaderElector]:
    """The layout's writer (and with DRA on the ResourceSlices'), the controller feeding it, and
    the Lease that says who writes."""
    namespace = topology_namespace()
    core = kubernetes.client.CoreV1Api(client)
    writer: Writer = (
        SingleWriter(core, topology_name(), namespace)
        if layout == "single"
        else PerNodeWriter(core, namespace)
    )
    if dra is not None:
        resource = kubernetes.client.ResourceV1Api(client)
        claims = ClaimStatusWriter(resource) if dra.claim_status else None
        writer = WithSlices(writer, SliceWriter(resource, dra), claims)
    controller = Controller(
        core, writer, resync_s=resync_s, mig_parted_config=mig_parted_config, dra=dra,
        pod_labels=pod_labels, namespace=namespace, node_labels=node_labels,
        kai_selector=kai_selector,
    )  # fmt: skip
    elector = LeaderElector(
        kubernetes.client.CoordinationV1Api(lease_client or client),
        lease_name,
        namespace,
        identity,
        controller.became_leader,
        timing,
    )
    controller.is_leader = elector.is_leader
    return writer, controller, elector


def _supervise(
    threads: tuple[threading.Thread, ...],
    controller: Controller,
    elector: LeaderElector,
    published: Published,
    stop: threading.Event,
) -> int:
    """Publish health until SIGTERM (EXIT_OK), or until a loop stops (EXIT_INTERNAL)."""
    while True:
        # Each loop outlives API trouble; one that ended anyway would leave the updater writing
        # from a frozen view (or not at all) while it looks alive. Exit: the kubelet restarts it.
        dead = [t.name for t in threads if not t.is_alive()]
        trouble = _stuck(controller, elector) or elector.trouble()
        published.publish(_health(controller, elector.is_leader(), dead, trouble))
        if stop.wait(WATCHDOG_S):
            return EXIT_OK
        if dead:
            log.error("the %s thread stopped; exiting to be restarted", ", ".join(dead))
            stop.set()  # the other loops end too
            elector.release()
            return EXIT_INTERNAL


def _stuck(controller: Controller, elector: LeaderElector) -> str | None:
    """A loop that is alive but has not turned for far longer than a busy turn takes: every
    call it makes has a timeout, so only a hang (a bug, a lock never let go) gets here. The
    elector's tries end within a round (its renew deadline) and it turns every retry period."""
    now = time.monotonic()
    timing = elector.timing
    limits = (("writer", controller.turned, WRITER_STUCK_S),
              ("elector", elector.turned, 3 * (timing.renew_deadline_s + timing.retry_period_s)))  # fmt: skip
    for name, turned, limit in limits:
        if now - turned > limit:
            return f"the {name} thread is stuck: no turn for {now - turned:.0f} s"
    return None


def _health(
    controller: Controller, leader: bool, dead: list[str], trouble: str | None = None
) -> Snapshot:
    """`/health` and the updater's own `/metrics`: whether it follows the cluster, and what it
    had to skip."""
    waiting = sorted(controller.sources - controller.synced)
    if dead:
        reason = f"the {', '.join(dead)} thread stopped"
    elif waiting:
        reason = f"waiting for the first list of {', '.join(waiting)}"
    else:
        reason = trouble or "ok"
    own = selfmetrics.exposition(
        controller.invalid.family(),
        selfmetrics.gauge(
            "mig_status_updater_leader",
            "1 while this replica writes the topology ConfigMaps.",
            int(leader),
        ),
    )
    return Snapshot((), reason == "ok", reason, own)
