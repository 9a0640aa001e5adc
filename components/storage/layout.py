"""The filesystem's layout, derived once from the spec: which target lives where, under which name, and what
clients mount. Pure, so the planner is tested on its own and every script and object reads the same answer.

Names and IDs come from the spec's explicit target indexes, never from list positions: adding a server never
renumbers another (a renumbered BeeGFS node or Lustre index is a different target to the filesystem).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..spec import ClusterSpec
from ..spec.storage import StorageServer, quota_id

# Start order the backends need: management first, then metadata, then data (reference section 5.3).
ROLE_ORDER = {"mgs": 0, "mgs-mdt": 0, "mgmtd": 0, "mdt": 1, "meta": 1, "ost": 2, "storage": 2}
DATA_ROLES = ("ost", "storage")


@dataclass(frozen=True)
class Target:
    server: str
    role: str
    device: str
    index: int
    label: str            # the filesystem label the target's device carries once formatted
    mount: str            # where its server mounts it
    reformat: bool
    service_nids: tuple[str, ...] = ()     # Lustre: this server's NID, then its failover partner's
    raid_level: str = "none"               # as the spec declares it; md arrays are checked on the host


@dataclass(frozen=True)
class Layout:
    kind: str
    version: str
    fs_name: str
    mount_point: str
    targets: tuple[Target, ...]
    servers: tuple[StorageServer, ...]
    manager: str              # the MGS NIDs (Lustre), mgmtd address (BeeGFS), backends (WEKA) or admin node (Scale)
    client_source: str        # what a client mounts (Lustre, WEKA, Scale's device) or its sysMgmtdHost (BeeGFS)
    node_ids: dict[str, dict[str, int]] = field(default_factory=dict)   # BeeGFS: host -> role -> numeric ID
    project_ids: dict[str, int] = field(default_factory=dict)           # tenant namespace -> quota ID
    read_gb_per_s: float | None = None

    def on(self, hostname: str) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.server == hostname)

    @property
    def data_servers(self) -> int:
        return len({t.server for t in self.targets if t.role in DATA_ROLES})


def nid(server: StorageServer, lnet: str) -> str:
    return f"{server.nid_address}@{lnet}"


def plan_layout(spec: ClusterSpec) -> Layout | None:
    storage = spec.storage
    if storage.kind == "none":
        return None
    project_ids = {t.namespace_name: t.storage.group_id or quota_id(t.namespace_name)
                   for t in spec.tenants if t.storage.filesystem_gib}
    if storage.client_only:     # the site's cluster: nothing here but what its clients mount
        weka, scale = storage.weka, storage.scale
        if weka is not None:
            manager = ",".join(weka.backends)
            source, read = f"{manager}/{storage.remote_name}", weka.read_gb_per_s
        else:
            assert scale is not None
            manager, source, read = scale.admin_node.hostname, storage.remote_name, scale.read_gb_per_s
        return Layout(storage.kind, storage.effective_version, storage.fs_name, storage.mount_point, (), (),
                      manager, source, {}, project_ids, read)
    servers = {s.hostname: s for s in storage.servers}
    lnet = spec.storage_lnet
    fs = storage.fs_name
    targets = []
    node_ids: dict[str, dict[str, int]] = {}
    for server in storage.servers:
        partner = servers.get(server.failover) if server.failover else None
        service = (nid(server, lnet),) + ((nid(partner, lnet),) if partner else ())
        for t in server.targets:
            if storage.kind == "lustre":
                label = {"mgs": "MGS"}.get(t.role) or f"{fs}-{'OST' if t.role == 'ost' else 'MDT'}{t.index:04x}"
                mount = f"/srv/lustre/{fs}/{t.role.replace('mgs-mdt', 'mdt')}{'' if t.role == 'mgs' else t.index}"
            else:
                label = f"{fs}{t.role[0]}{t.index}"     # within XFS's 12 characters (checked by the spec)
                mount = f"/srv/beegfs/{fs}/{t.role}{'' if t.role == 'mgmtd' else t.index}"
                if t.role != "mgmtd":   # a BeeGFS server's numeric ID per service: its lowest target's ID
                    ids = node_ids.setdefault(server.hostname, {})
                    ids[t.role] = min(ids.get(t.role, t.index), t.index)
            targets.append(Target(server.hostname, t.role, t.device, t.index, label, mount, t.reformat,
                                  service if storage.kind == "lustre" else (), t.raid_level))
    targets.sort(key=lambda t: (ROLE_ORDER[t.role], t.index, t.server))
    manager_server = next(servers[t.server] for t in targets if t.role in ("mgs", "mgs-mdt", "mgmtd"))
    if storage.kind == "lustre":
        mgs = next(t for t in targets if t.role in ("mgs", "mgs-mdt"))
        manager = ":".join(mgs.service_nids)     # failover MGS NIDs separated by ':' (reference 5.3)
        source = f"{manager}:/{fs}"
    else:
        manager = source = manager_server.nid_address
    data_servers = len({t.server for t in targets if t.role in DATA_ROLES})
    per_server = storage.read_gb_per_s_per_server
    return Layout(storage.kind, storage.effective_version, fs, storage.mount_point, tuple(targets),
                  tuple(storage.servers), manager, source, node_ids, project_ids,
                  None if per_server is None else data_servers * per_server)
