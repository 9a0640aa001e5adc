"""ParallelFilesystem: Lustre or BeeGFS servers, the GPU hosts' clients, shared directories and the volumes
tenants claim, from one spec; or, for a WEKA or Storage Scale cluster the site runs, the clients alone.

Resources, keyed by host name: `<name>-<server>` per storage server (protected: deleting one needs an explicit
unprotect, and its delete script only unmounts; replaced only when its targets change, updated in place for
any other change), created management first, then metadata, then data servers;
`<name>-<host>` per GPU host (the client, after its fabric is set up; the first client's also applies the
shared directories and quotas, and updates in place when only they change); on BeeGFS with auth, each server
and client script writes the shared connection secret, which its command passes on standard input (secret).
Volumes are `<name>-pv-<namespace>-<claim>` and `<name>-pvc-<namespace>-<claim>`.
A site's cluster (WEKA, Scale): `<name>-<host>` is the client (WEKA) or the node's own preparation (Scale),
`<name>-<host>-member` the node's join on Scale's admin node, `<name>-directories` the tenants' directories and
quotas (converging), and with its CSI driver `<name>-csi-*` and a StorageClass `<name>-sc-<namespace>` per tenant.
In a shard's stack of a split environment (`servers` given) it holds only its hosts' clients.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Collection, Mapping, NamedTuple

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from ..k8s.helm import release
from ..k8s.images import through_mirror
from ..k8s.objects import register
from ..spec import ClusterSpec
from ..spec.hardware import Host, NodePool
from ..ssh import Lib, Script, SshTarget, push
from ..types import token, with_aliases
from . import csi
from .clients import render_scale_member, render_scale_node, render_weka_client
from .kubernetes import render_volumes
from .layout import ROLE_ORDER, Layout, plan_layout
from .scripts import (render_beegfs_client, render_beegfs_server, render_directories,
                      render_lustre_client, render_lustre_server)


def filesystem_outputs(spec: ClusterSpec, layout: Layout) -> dict[str, Any]:
    """What the plan shows next to the GPUs the filesystem feeds (reference designs: at least 10 GB/s in all for
    a standard cluster, 100 GB/s for a large one)."""
    data = [t for t in layout.targets if t.role in ("ost", "storage")]
    capacity = spec.storage.capacity_tib
    read = layout.read_gb_per_s
    return {"kind": layout.kind, "version": layout.version, "fs_name": layout.fs_name,
            "mount_point": layout.mount_point, "manager": layout.manager,
            "data_servers": layout.data_servers, "data_targets": len(data),
            "capacity_tib": round(capacity, 3) if capacity is not None else 0 if not spec.storage.client_only
            else None,
            "read_gb_per_s": read, "gpus": spec.gpus,
            "read_gb_per_s_per_gpu": None if read is None or not spec.gpus else round(read / spec.gpus, 3)}


def server_identity(layout: Layout, hostname: str) -> str:
    """What a storage server's command stands for: its targets' roles, indexes, devices and mounts. Only a
    change to these replaces the (protected) command; tunables, quotas, LNet, packages and secrets update it in
    place, since its script converges and replacing it would unmount the targets under every client."""
    return "\n".join(f"{layout.kind} {layout.fs_name} {t.role} {t.index} {t.device} {t.mount}"
                     for t in layout.on(hostname))


class ServersElsewhere(NamedTuple):
    """A filesystem whose servers, directories and volumes another stack builds (a split environment's platform
    stack, README: Split stacks)."""
    ready: pulumi.Resource
    """What every client here waits for: that stack, read once it is applied."""
    auth: pulumi.Input[str] | None
    """BeeGFS's connection secret as that stack exports it (a secret); None without auth."""


class ParallelFilesystem(pulumi.ComponentResource):
    TYPE: ClassVar[str] = token("ParallelFilesystem")

    layout: Layout
    """Targets, their servers, labels and mounts; the MGS NIDs or mgmtd address; tenants' quota IDs."""
    outputs: dict[str, Any]
    """Mount point, manager, capacity and the expected aggregate read bandwidth against the GPUs."""
    clients: dict[str, pulumi.Resource]
    """The client of each GPU host, by hostname (what needs the filesystem mounted waits on these)."""
    auth: pulumi.Output[str] | None
    """BeeGFS's connection secret (a Pulumi secret), for clients this library does not set up; None without."""

    def __init__(self, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str],
                 opts: pulumi.ResourceOptions | None = None, host_ready: dict[str, list[pulumi.Resource]] | None = None,
                 namespaces: dict[str, pulumi.Input[str]] | None = None, *, libs: Mapping[str, Lib] | None = None,
                 client_hosts: Collection[str] | None = None, servers: ServersElsewhere | None = None,
                 api_password: pulumi.Input[str] | None = None):
        """`libs`: per GPU host name, the shared parts its node pool's `-scripts` copy put there before
        `host_ready` (GpuNodePool.lib, given `render_client`'s scripts to carry); a client runs its parts
        from there. Omitted: each client holds its whole script. `client_hosts`: the GPU hosts whose clients
        this builds; omitted: every GPU host's. `servers`: set up by another stack, so only clients here;
        omitted: the servers, directories and volumes are built here. `api_password`: the WEKA API user's
        (storage.weka.api_username), a secret, which sets the tenants' directory quotas; needed with them."""
        super().__init__(self.TYPE, name, intent(spec), with_aliases(self.TYPE, opts))
        compose(self, name, spec, ssh_private_key, host_ready=host_ready, namespaces=namespaces, libs=libs,
                client_hosts=client_hosts, servers=servers, api_password=api_password)


def intent(spec: ClusterSpec) -> dict[str, Any]:
    """A ParallelFilesystem's registered inputs: the spec's storage, for policies."""
    return {"spec": spec.storage.model_dump(mode="json")}


def render_client(spec: ClusterSpec, layout: Layout, pool: NodePool, host: Host) -> Script:
    """A GPU host's filesystem client: one text for every host of its pool but for the host's name."""
    if layout.kind == "scale":
        return render_scale_node(spec, layout, pool, host.hostname)
    render = {"beegfs": render_beegfs_client, "wekafs": render_weka_client}.get(layout.kind, render_lustre_client)
    return render(spec, layout, host.hostname, spec.storage_client_interface(pool) or "")


def compose(filesystem: Any, name: str, spec: ClusterSpec, ssh_private_key: pulumi.Input[str], *,
            host_ready: dict[str, list[pulumi.Resource]] | None,
            namespaces: dict[str, pulumi.Input[str]] | None, libs: Mapping[str, Lib] | None = None,
            client_hosts: Collection[str] | None = None, servers: ServersElsewhere | None = None,
            api_password: pulumi.Input[str] | None = None) -> None:
    """A ParallelFilesystem's children and outputs, under `filesystem`: a ParallelFilesystem, or the component
    provider's (provider.py)."""
    layout = plan_layout(spec)
    assert layout is not None, "a ParallelFilesystem needs a storage.kind other than none"
    filesystem.layout, filesystem.outputs = layout, filesystem_outputs(spec, layout)
    ready = host_ready or {}
    ssh = spec.ssh
    beegfs = layout.kind == "beegfs"
    clients = [(p, h) for p, h in spec.hosts() if client_hosts is None or h.hostname in client_hosts]
    first = clients[0][1] if clients else None
    secret = random.RandomPassword(f"{name}-auth", length=64, special=False,
                                   opts=pulumi.ResourceOptions(parent=filesystem)) \
        if beegfs and spec.storage.auth and servers is None else None

    # push() keeps it secret
    stdin = secret.result if secret is not None else servers.auth if servers is not None else None
    filesystem.auth = stdin
    done: list[pulumi.Resource] = [servers.ready] if servers is not None else []
    stages = set() if servers is not None else {min(ROLE_ORDER[t.role] for t in layout.on(s.hostname))
                                                  for s in layout.servers}
    for stage in sorted(stages):
        started = []
        for server in layout.servers:
            if min(ROLE_ORDER[t.role] for t in layout.on(server.hostname)) != stage:
                continue
            target = SshTarget(server.address, ssh.user, ssh.port, server.host_key, ssh.bastion)
            rendered = (render_beegfs_server if beegfs else render_lustre_server)(spec, layout, server.hostname)
            started.append(push(f"{name}-{server.hostname}", target, rendered, ssh_private_key,
                                parent=filesystem, depends_on=done + ready.get(server.hostname, []), protect=True,
                                stdin=stdin, replace_on=server_identity(layout, server.hostname)))
        done = done + started
    filesystem.clients = {}
    for pool, host in clients:
        target = SshTarget(host.address, host.ssh_user or ssh.user, host.ssh_port or ssh.port, host.host_key,
                           ssh.bastion)
        # The first client also applies the shared directories and quotas, in its own session: a change to
        # them updates that command in place (no remount), a change to the client replaces it. (In a split
        # environment, the first of each stack's: a stack's hosts open to work after it, README: Split stacks.)
        then = render_directories(spec, layout, host.hostname).create \
            if host is first and not spec.storage.client_only else None
        filesystem.clients[host.hostname] = push(
            f"{name}-{host.hostname}", target, render_client(spec, layout, pool, host), ssh_private_key,
            parent=filesystem, depends_on=done + ready.get(host.hostname, []), stdin=stdin, then=then,
            lib=(libs or {}).get(host.hostname))
    directories = _join_site_cluster(filesystem, name, spec, layout, clients, ssh_private_key, api_password) \
        if spec.storage.client_only and first else None
    weka, scale = spec.storage.weka, spec.storage.scale
    if weka is not None and weka.csi.enabled and servers is None:
        _weka_csi(filesystem, name, spec, layout.project_ids, api_password, list(filesystem.clients.values()))
    if scale is not None and scale.csi.enabled and servers is None:
        _scale_csi(filesystem, name, spec, layout.project_ids, api_password, list(filesystem.clients.values()))
    for manifest in render_volumes(spec, layout) if servers is None else ():
        ns = manifest.obj["metadata"].get("namespace")
        after = [directories] if directories else [filesystem.clients[first.hostname]] if first else done
        register(f"{name}-{manifest.role}", manifest.obj, pulumi.ResourceOptions(parent=filesystem, depends_on=after),
                 namespace=(namespaces or {}).get(ns) if ns else None)
    filesystem.register_outputs({**intent(spec), **filesystem.outputs})


def _join_site_cluster(filesystem: Any, name: str, spec: ClusterSpec, layout: Layout,
                       clients: list[tuple[NodePool, Host]], ssh_private_key: pulumi.Input[str],
                       api_password: pulumi.Input[str] | None) -> pulumi.Resource:
    """The site cluster's side of its clients: on Scale, each host joined through the admin node
    (`<name>-<host>-member`, after the host's own step; converging, so a change to it (GDS, say) runs it again
    in place, and only deleting it takes the node out of the cluster), which is then what waits on the host's
    client; and the shared directories (`<name>-directories`), converging, on the
    first client (WEKA, with the API password on its input) or the admin node (Scale)."""
    ssh = spec.ssh
    first = clients[0][1]
    scale = spec.storage.scale
    if scale is not None:
        admin = SshTarget(scale.admin_node.address, ssh.user, ssh.port, scale.admin_node.host_key, ssh.bastion)
        for pool, host in clients:
            filesystem.clients[host.hostname] = push(
                f"{name}-{host.hostname}-member", admin, render_scale_member(spec, layout, pool, host.hostname),
                ssh_private_key, parent=filesystem, depends_on=[filesystem.clients[host.hostname]], converge=True)
        where, stdin, runs_on = admin, None, scale.admin_node.hostname
    else:
        where = SshTarget(first.address, first.ssh_user or ssh.user, first.ssh_port or ssh.port, first.host_key,
                          ssh.bastion)
        stdin, runs_on = api_password if spec.storage.effective_quotas else None, first.hostname
    return push(f"{name}-directories", where, render_directories(spec, layout, runs_on), ssh_private_key,
                parent=filesystem, depends_on=[filesystem.clients[first.hostname]], converge=True, stdin=stdin)


def _weka_csi(parent: Any, name: str, spec: ClusterSpec, group_ids: dict[str, int],
              api_password: pulumi.Input[str] | None, after: list[pulumi.Resource]) -> pulumi.Resource:
    """`<name>-csi-namespace`, `<name>-csi-api-secret` (the password a Pulumi secret), the `<name>-csi` release
    (after `after`: the hosts' clients, which its node plugin mounts through) and `<name>-sc-<namespace>` per
    tenant, with every image through the mirror. Returns the release."""
    namespace = register(f"{name}-csi-namespace", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": csi.NAMESPACE}},
                         pulumi.ResourceOptions(parent=parent))
    data: dict[str, pulumi.Input[str]] = {**csi.api_secret_data(spec), "password": pulumi.Output.secret(api_password)}
    secret = k8s.core.v1.Secret(f"{name}-csi-api-secret", type="Opaque", string_data=data,
                                metadata={"name": csi.API_SECRET, "namespace": csi.NAMESPACE},
                                opts=pulumi.ResourceOptions(parent=parent, depends_on=[namespace]))
    plugin = release(f"{name}-csi", csi.RELEASE, csi.chart(spec), csi.NAMESPACE,
                     through_mirror(csi.render_values(spec), spec, csi.chart_images(spec)),
                     pulumi.ResourceOptions(parent=parent, depends_on=[namespace, secret, *after]))
    for manifest in csi.render_storage_classes(spec, group_ids):
        register(f"{name}-{manifest.role}", manifest.obj, pulumi.ResourceOptions(parent=parent, depends_on=[plugin]))
    return plugin


def _scale_csi(parent: Any, name: str, spec: ClusterSpec, group_ids: dict[str, int],
               api_password: pulumi.Input[str] | None, after: list[pulumi.Resource]) -> None:
    """`<name>-csi-namespace`, the operator (`<name>-csi-operator`, its installer manifest), the GUI secret
    (`<name>-csi-gui-secret`, the password a Pulumi secret), the CSIScaleOperator (after the nodes joined, whose
    plugin it runs there) and `<name>-sc-<namespace>` per tenant."""
    namespace = register(f"{name}-csi-namespace", {"apiVersion": "v1", "kind": "Namespace",
                                                   "metadata": {"name": csi.SCALE_NAMESPACE}},
                         pulumi.ResourceOptions(parent=parent))
    operator = _scale_operator(f"{name}-csi-operator", spec, pulumi.ResourceOptions(parent=parent,
                                                                                     depends_on=[namespace]))
    metadata, data = csi.scale_gui_secret(spec)
    secret = k8s.core.v1.Secret(f"{name}-csi-gui-secret", type="Opaque", metadata=metadata,
                                string_data={**data, "password": pulumi.Output.secret(api_password)},
                                opts=pulumi.ResourceOptions(parent=parent, depends_on=[namespace]))
    cr = csi.render_scale_operator(spec)
    driver = register(f"{name}-{cr.role}", through_mirror(cr.obj, spec, csi.scale_image_settings(spec)),
                      pulumi.ResourceOptions(
        parent=parent, depends_on=[operator, secret, *after]))
    for manifest in csi.render_storage_classes(spec, group_ids):
        register(f"{name}-{manifest.role}", manifest.obj, pulumi.ResourceOptions(parent=parent, depends_on=[driver]))


def _scale_operator(name: str, spec: ClusterSpec, opts: pulumi.ResourceOptions) -> pulumi.Resource:
    """The operator's installer: from a URL as it is; from a file in the project read here, so the plan shows
    every object and a mirror reaches the operator's images. Aliased, so a stack that applied the same file as a
    ConfigFile keeps its objects (its CRD going would take the driver's CR with it)."""
    csi_settings = spec.storage.scale.csi if spec.storage.scale else None
    assert csi_settings is not None
    if not csi_settings.operator_path:
        return k8s.yaml.v2.ConfigFile(name, file=csi.scale_operator_source(spec), opts=opts)
    field = "storage.scale.csi.operator_path"
    try:
        objects = csi.scale_operator_objects(Path(csi_settings.operator_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise pulumi.RunError(f"{field}: cannot read {csi_settings.operator_path} ({e.__class__.__name__}: "
                              f"{getattr(e, 'strerror', None) or e}); put the operator's installer there, or "
                              "point operator_path at it") from None
    except ValueError as e:
        raise pulumi.RunError(f"{field}: {csi_settings.operator_path} {e}; download the release's installer "
                              "again") from None
    return k8s.yaml.v2.ConfigGroup(name, objs=through_mirror(objects, spec), opts=pulumi.ResourceOptions.merge(
        opts, pulumi.ResourceOptions(aliases=[pulumi.Alias(type_="kubernetes:yaml/v2:ConfigFile")])))
