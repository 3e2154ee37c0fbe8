"""The agent as one object: identity first, then the device loops, the Workload API, metrics and the
maintenance thread (node SVID renewal at half life, trust bundle refresh, workload SVID renewal)."""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from agent.api import ApiClient, Refused, Unreachable
from agent.at_rest import AtRest, default_key_file
from agent.created import CreatedPaths
from agent.device_loop import DeviceLoop, LoopSettings
from agent.identity import NODE_FILE, SEALED_KEY, AgentError, NodeIdentity
from agent.metrics import AgentMetrics
from agent.svids import CACHE_FILE, SvidCache, WorkloadSvids, retry_wait
from agent.wiring import NvueLeaf, OvsNode, lab_devices, node_devices
from agent.workload_api import WorkloadApiServer
from core.slugs import require_slug

log = logging.getLogger("trustfabric.agent")


@dataclass(frozen=True)
class AgentConfig:
    node: str
    server: str
    ca_file: Path
    data_dir: Path
    join_token: str | None = None
    socket: Path | None = None
    metrics_addr: str | None = None
    lab_home: Path | None = None
    ovs: OvsNode | None = None  # a real node's OVS bridge (instead of the lab's)
    nvue: NvueLeaf | None = None  # a real leaf's NVUE API (instead of the lab's)
    key_file: Path | None = None  # the at-rest secret (agent/at_rest.py); default beside the data directory
    loop: LoopSettings = field(default_factory=LoopSettings)
    placements_every: float = 5.0
    bundle_every: float = 30.0
    maintenance_every: float = 1.0


class Agent:
    def __init__(self, config: AgentConfig) -> None:
        require_slug(config.node, "node name")
        if config.lab_home is not None and (config.ovs or config.nvue):
            raise AgentError("--lab drives the lab's devices, --ovs-bridge and --nvue a real node's: give one or the "
                             "other")
        self.config = config
        self.stop_event = threading.Event()
        self.metrics = AgentMetrics()
        node_file = Path(config.data_dir) / NODE_FILE
        sealed = node_file.exists() and SEALED_KEY in node_file.read_bytes()
        key_file = config.key_file or default_key_file(config.data_dir)
        # what this start makes on disk, taken back if it fails before the node holds an SVID (see start)
        self.created = CreatedPaths()
        if not sealed:  # (a sealed key's file is never made: its directory is not either)
            self.created.make_dir(key_file.parent)
        self.created.make_dir(config.data_dir, 0o711)
        try:
            # a new key file only for a new node or one migrating from a plaintext key: a sealed key needs its own
            at_rest = AtRest.open(key_file, config.node, create=not sealed)
            if at_rest.created:
                self.created.note_file(key_file)
            self.identity = NodeIdentity(config.data_dir, config.node, config.ca_file, at_rest)
        except BaseException:
            self._take_back()
            raise
        self.api = ApiClient(config.server, self.identity)
        self.svids = WorkloadSvids(self.api, self.metrics, refresh_every=config.placements_every,
                                   cache=SvidCache(self.identity.dir / CACHE_FILE, at_rest))
        self.loops: list[DeviceLoop] = []
        self.workload_api: WorkloadApiServer | None = None
        self._maintenance: threading.Thread | None = None
        self._node_retry_at = 0.0  # monotonic: the node SVID's renewal failed; not asked again before then
        self._node_failures = 0
        self._jitter = random.Random()  # spreads retries (no secret)

    # ------------------------------------------------------------------ identity
    def ensure_identity(self) -> None:
        """Attest with the join token when there is no usable node SVID; otherwise keep the stored one."""
        svid = self.identity.svid
        now = datetime.now(UTC)
        if svid is not None and now < svid.not_after:
            self._note_node_svid()
            return
        if not self.config.join_token:
            what = "has expired" if svid is not None else "does not exist yet"
            raise AgentError(f"the node SVID in {self.config.data_dir} {what}: start the agent with a new join token "
                             f"(`trustfabric node token create --node {self.config.node}`)")
        self.api.attest(self.config.join_token)
        log.info("node %s attested: %s", self.config.node, self.identity.svid.spiffe_id if self.identity.svid else "")
        self._note_node_svid()

    def _note_node_svid(self) -> None:
        """The node SVID's expiry in the metrics: from the start, not from the first maintenance round."""
        svid = self.identity.svid
        if svid is not None:
            self.metrics.svid_expiry.labels(svid.spiffe_id).set(svid.not_after.timestamp())

    def maintain(self, *, bundle: bool = True) -> None:
        """One maintenance round: renew the node SVID at half life, refresh the bundle (a changed bundle renews
        every workload SVID: a new CA generation signs them), renew workload SVIDs past half life.

        A node SVID renewal that fails (refused, unanswered) keeps the held one, which mTLS goes on using while it is
        valid, and does not hold back the rest of the round; it is asked again no sooner than the server's
        Retry-After, or a backoff (agent.svids.retry_wait): a rate-limited agent never asks every round."""
        svid = self.identity.svid
        if svid is not None:
            if datetime.now(UTC) >= svid.renew_due() and time.monotonic() >= self._node_retry_at:
                try:
                    self.api.renew()
                except (Unreachable, Refused) as exc:
                    wait = retry_wait(self._node_failures, exc.retry_after if isinstance(exc, Refused) else None,
                                      self._jitter)
                    # never past half of what the held SVID has left: a long Retry-After must not let it expire
                    # (the node would then need a new join token)
                    left = (svid.not_after - datetime.now(UTC)).total_seconds()
                    wait = max(1.0, min(wait, left / 2))
                    self._node_failures += 1
                    self._node_retry_at = time.monotonic() + wait
                    log.warning("node SVID not renewed, the one held (valid until %s) is kept; retrying in %.1fs: "
                                "%s", svid.not_after, wait, exc)
                else:
                    self._node_failures, self._node_retry_at = 0, 0.0
                    svid = self.identity.svid
                    log.info("node SVID renewed, valid until %s", svid.not_after if svid else "?")
            self._note_node_svid()
        if bundle and self.api.refresh_bundle():
            log.info("trust bundle changed: workload SVIDs are renewed")
            self.svids.rotate_all()
        self.svids.renew_due()

    def _maintain_forever(self) -> None:
        last_bundle = time.monotonic()
        while not self.stop_event.wait(self.config.maintenance_every):
            due = time.monotonic() - last_bundle >= self.config.bundle_every
            try:
                self.maintain(bundle=due)
                if due:
                    last_bundle = time.monotonic()
            except (Unreachable, Refused) as exc:
                log.warning("maintenance: %s", exc)
            except Exception:
                log.exception("maintenance failed")

    # ------------------------------------------------------------------ life cycle
    def start(self) -> Agent:
        try:
            return self._start()
        except BaseException:
            self._take_back()
            raise

    def _take_back(self) -> None:
        """Remove what this start made (agent/created.py) while the data directory holds no node key: a start that
        ends before the node attested leaves nothing behind. Once a node.pem exists (attested, or an older agent's
        key sealed in place under a key file made now) everything stays: the key file opens it."""
        if not (Path(self.config.data_dir) / NODE_FILE).exists():
            self.created.remove()

    def _start(self) -> Agent:
        # the devices first: a wrong --lab or --ovs-bridge stops the agent before a join token is spent on it
        wirings = lab_devices(self.config.lab_home, self.config.node) if self.config.lab_home is not None \
            else node_devices(self.config.node, self.config.ovs, self.config.nvue)
        self.ensure_identity()
        try:
            self.api.refresh_bundle()
        except (Unreachable, Refused) as exc:  # the stored bundle (or --ca) serves until the server answers
            log.warning("trust bundle not refreshed: %s", exc)
        for wiring in wirings:
            loop = DeviceLoop(wiring, self.api, self.metrics, self.stop_event, self.config.loop)
            self.loops.append(loop)
            loop.start()
        try:  # re-sync the workload SVIDs kept by the last run before the Workload API serves them
            self.svids.refresh_placements(force=True)
        except (Unreachable, Refused) as exc:
            log.warning("workload identities not re-synced yet (the Workload API answers UNAVAILABLE until they "
                        "are): %s", exc)
        if self.config.socket is not None:
            self.workload_api = WorkloadApiServer(self.config.socket, self.identity, self.svids, self.metrics)
        if self.config.metrics_addr:
            self.metrics.serve(self.config.metrics_addr)
        self._maintenance = threading.Thread(target=self._maintain_forever, name="agent-maintenance", daemon=True)
        self._maintenance.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.svids.close()  # (before the client: an answer that still arrives is not written to the cache)
        self.api.close()  # ends the held long-polls at once
        if self.workload_api is not None:
            self.workload_api.stop()
        for loop in self.loops:
            loop.join(5)
        if self._maintenance is not None:
            self._maintenance.join(5)
        self.metrics.close()

    def wait(self) -> None:
        self.stop_event.wait()
