"""The parallel filesystem: Lustre or BeeGFS servers, their devices and targets."""

from __future__ import annotations

from typing import Iterator, Literal

from pydantic import Field

from .common import AbsPath, DevicePath, DnsLabel, HostName, IpAddress, Problem, SpecModel
from .hardware import HostKey

# Upstream vocabulary for each backend's target roles.
STORAGE_ROLES: dict[str, tuple[str, ...]] = {
    "lustre": ("mgs", "mdt", "ost"),
    "beegfs": ("mgmtd", "meta", "storage"),
}


class StorageTarget(SpecModel):
    role: Literal["mgs", "mdt", "ost", "mgmtd", "meta", "storage"]
    device: DevicePath = Field(description="Block device, e.g. /dev/disk/by-id/nvme-...")
    index: int = Field(0, ge=0, le=65535, description="Target index within its role. Omitted: 0.")
    reformat: bool = Field(
        False, description="Format the device even when it already holds a filesystem, destroying its data. "
                           "Omitted: a device that holds a filesystem is never formatted.")


class StorageServer(SpecModel):
    hostname: HostName
    address: IpAddress
    rack: DnsLabel
    host_key: HostKey | None = Field(None, description="Omitted: the server's identity is not verified.")
    targets: list[StorageTarget] = Field(min_length=1, max_length=256)


class StorageSpec(SpecModel):
    kind: Literal["none", "lustre", "beegfs"] = Field("none", description="Omitted: no parallel filesystem.")
    fs_name: str = Field("gpufs", pattern=r"^[a-z][a-z0-9]{0,7}$",
                         description="Filesystem name, at most 8 characters (Lustre's limit). Omitted: gpufs.")
    mount_point: AbsPath = Field("/mnt/gpufs", description="Omitted: /mnt/gpufs.")
    servers: list[StorageServer] = Field(default_factory=list, max_length=1024, description="Omitted: no storage servers.")

    def _roles_match_kind(self) -> Iterator[Problem]:
        if self.kind == "none":
            if self.servers:
                yield Problem(("servers",), "servers are listed but kind is none; set kind to lustre or beegfs")
            return
        roles = STORAGE_ROLES[self.kind]
        seen: dict[tuple[str, int], str] = {}
        for i, s in enumerate(self.servers):
            for j, t in enumerate(s.targets):
                if t.role not in roles:
                    yield Problem(("servers", i, "targets", j, "role"),
                                  f"{s.hostname} has a {t.role} target, which {self.kind} does not have; "
                                  f"{self.kind} roles are {', '.join(roles)}")
                key = (t.role, t.index)
                if key in seen:
                    yield Problem(("servers", i, "targets", j, "index"),
                                  f"{t.role} index {t.index} is on both {seen[key]} and {s.hostname}; "
                                  "give each target its own index")
                seen[key] = s.hostname
        missing = [r for r in roles if r not in {r for r, _ in seen}]
        if missing:
            yield Problem(("servers",), f"no {', '.join(missing)} target: a {self.kind} filesystem needs at least "
                                       f"one of each of {', '.join(roles)}")

    _checks = (_roles_match_kind,)
