"""The parallel filesystem: Lustre or BeeGFS servers, their devices and targets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .common import CrossFieldError, DnsLabel, HostName, IpAddress, Problem, SpecModel, field_error
from .hardware import HostKey

# Upstream vocabulary for each backend's target roles.
STORAGE_ROLES: dict[str, tuple[str, ...]] = {
    "lustre": ("mgs", "mdt", "ost"),
    "beegfs": ("mgmtd", "meta", "storage"),
}


class StorageTarget(SpecModel):
    role: Literal["mgs", "mdt", "ost", "mgmtd", "meta", "storage"]
    device: str = Field(pattern=r"^/dev/[A-Za-z0-9/_.-]+$", description="Block device, e.g. /dev/disk/by-id/nvme-...")
    index: int = Field(0, ge=0, le=65535, description="Target index within its role. Omitted: 0.")
    reformat: bool = Field(
        False, description="Format the device even when it already holds a filesystem, destroying its data. "
                           "Omitted: a device that holds a filesystem is never formatted.")


class StorageServer(SpecModel):
    hostname: HostName
    address: IpAddress
    rack: DnsLabel
    host_key: HostKey | None = Field(None, description="Omitted: the server's identity is not verified.")
    targets: list[StorageTarget] = Field(min_length=1)


class StorageSpec(SpecModel):
    kind: Literal["none", "lustre", "beegfs"] = Field("none", description="Omitted: no parallel filesystem.")
    fs_name: str = Field("gpufs", pattern=r"^[a-z][a-z0-9]{0,7}$",
                         description="Filesystem name, at most 8 characters (Lustre's limit). Omitted: gpufs.")
    mount_point: str = Field("/mnt/gpufs", pattern=r"^/[A-Za-z0-9/_.-]*$", description="Omitted: /mnt/gpufs.")
    servers: list[StorageServer] = Field(default_factory=list, description="Omitted: no storage servers.")

    @model_validator(mode="after")
    def _roles_match_kind(self) -> StorageSpec:
        if self.kind == "none":
            if self.servers:
                raise field_error("servers", "servers are listed but kind is none; set kind to lustre or beegfs")
            return self
        roles = STORAGE_ROLES[self.kind]
        problems: list[str] = []
        seen: dict[tuple[str, int], str] = {}
        for s in self.servers:
            for t in s.targets:
                if t.role not in roles:
                    problems.append(f"{s.hostname} has a {t.role} target, which {self.kind} does not have; "
                                    f"{self.kind} roles are {', '.join(roles)}")
                key = (t.role, t.index)
                if key in seen:
                    problems.append(f"{t.role} index {t.index} is on both {seen[key]} and {s.hostname}; "
                                    "give each target its own index")
                seen[key] = s.hostname
        present = {r for r, _ in seen}
        missing = [r for r in roles if r not in present]
        if missing:
            problems.append(f"no {', '.join(missing)} target: a {self.kind} filesystem needs at least one of each "
                            f"of {', '.join(roles)}")
        if problems:
            raise CrossFieldError([Problem(("servers",), p) for p in problems])
        return self
