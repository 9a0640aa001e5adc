"""The parallel filesystem as registered: no reformat outside dev, protected servers, redundant targets, bandwidth."""

from __future__ import annotations

import re

from pulumi_policy import EnforcementLevel, ReportViolation, StackValidationArgs, StackValidationPolicy

from .common import (FILESYSTEM, REMOTE_COMMAND, dig, environment, guarded, intent, maps, number, of_type, schema,
                     settings, shown, text)

_REFORMAT_SCHEMA = schema(allowedEnvironments={
    "type": "array", "items": {"type": "string"}, "default": ["dev"],
    "description": "Environments whose specs may set reformat on a storage target."})


def _targets(fs):
    for server in maps(intent(fs).get("servers")):
        for target in maps(server.get("targets")):
            yield server, target


def _no_reformat(args: StackValidationArgs, report: ReportViolation) -> None:
    env = environment(args.resources)
    allowed = settings(args, _REFORMAT_SCHEMA)["allowedEnvironments"]
    if env in allowed:
        return
    for fs in of_type(args.resources, FILESYSTEM):
        for server, target in _targets(fs):
            if target.get("reformat"):
                report(f"{server.get('hostname')} target {target.get('device')} sets reformat in {env or 'an unnamed'} "
                       f"environment: a run would erase the data on it; remove reformat (allowed in "
                       f"{', '.join(allowed) or 'no environment'})", fs.urn)


def _servers_protected(args: StackValidationArgs, report: ReportViolation) -> None:
    """Judged by where a command connects and what it does, not where it sits: the filesystem's own server
    commands, and any other program's command with a delete against a storage server, must be protected."""
    for fs in of_type(args.resources, FILESYSTEM):
        servers = {}
        for s in maps(intent(fs).get("servers")):
            servers.update({text(s.get("address")): s.get("hostname"), text(s.get("hostname")): s.get("hostname")})
        servers.pop(None, None)
        for r in of_type(args.resources, REMOTE_COMMAND):
            if r.opts.protect:
                continue
            parent = r.parent.urn if r.parent is not None else None
            host = text(dig(r.props, "connection", "host"))
            if host not in servers:
                continue
            if parent == fs.urn:
                report(f"{r.name} sets up storage server {servers[host]} but is not protected, so a destroy or a "
                       "replacement runs its delete; protect it", r.urn)
            elif (m := _DESTRUCTIVE.search(text(r.props.get("delete")) or "")):
                report(f"{r.name} connects to storage server {servers[host]} ({host}) and its delete runs "
                       f"`{m.group(0).strip()}`, which destroys data, yet it is not protected: a destroy or a "
                       "replacement runs it on the server that holds the filesystem; protect it or drop that "
                       "from its delete", r.urn)


# Commands that destroy a device's or a directory tree's data (what a delete must never run unprotected on a
# storage server): filesystem creation and signature wiping, whole-device writes, volume and pool removal.
_DESTRUCTIVE = re.compile(
    r"(?<![\w.-])(?:mkfs(?:\.[a-z0-9]+)?|mkfs\.lustre|wipefs|blkdiscard|shred|sgdisk\s+(?:-Z|--zap-all)"
    r"|dd\s[^;|&\n]*\bof=/dev/\S+|zpool\s+(?:destroy|labelclear)|zfs\s+destroy|lvremove|vgremove|pvremove"
    r"|mdadm\s[^;|&\n]*--zero-superblock|rm\s+-[a-zA-Z]*[rR][a-zA-Z]*\s+/\S*)")


_RAID_SCHEMA = schema(allowedRaidLevels={
    "type": "array", "items": {"type": "string"}, "default": ["raid1", "raid6", "raid10", "raidz2"],
    "description": "RAID levels a storage target's device may use."})


def _raid(args: StackValidationArgs, report: ReportViolation) -> None:
    allowed = settings(args, _RAID_SCHEMA)["allowedRaidLevels"]
    for fs in of_type(args.resources, FILESYSTEM):
        for server, target in _targets(fs):
            if text(target.get("raid_level")) not in allowed:
                report(f"{server.get('hostname')} {target.get('role')} target {target.get('device')} is on "
                       f"{target.get('raid_level')}; use {' or '.join(allowed)} (RAID-6 survives two failed disks, "
                       "and a rebuild of a large RAID-5 often meets a second)", fs.urn)


_BANDWIDTH_SCHEMA = schema(minReadGbPerSecondPerGpu={
    "type": "number", "minimum": 0, "default": 0.15,
    "description": "Aggregate read bandwidth per GPU the filesystem must reach, in GB/s (the reference designs' "
                   "10 GB/s for a 64-GPU cluster is about 0.15)."})


def _bandwidth(args: StackValidationArgs, report: ReportViolation) -> None:
    floor = settings(args, _BANDWIDTH_SCHEMA)["minReadGbPerSecondPerGpu"]
    for fs in of_type(args.resources, FILESYSTEM):
        per_gpu, total, gpus = (number(fs.props.get(k)) for k in ("read_gb_per_s_per_gpu", "read_gb_per_s", "gpus"))
        if per_gpu is not None and per_gpu < floor:
            # a site's WEKA or Scale cluster is grown there; this library builds Lustre's and BeeGFS's servers
            site = {"wekafs": "weka", "scale": "scale"}.get(text(intent(fs).get("kind")) or "")
            fix = f"grow the site's cluster (or correct storage.{site}.read_gb_per_s)" if site else \
                "add storage servers (or correct read_gb_per_s_per_server)"
            report(f"{fs.name} reads {shown(total)} GB/s for {shown(gpus)} GPUs, {shown(per_gpu)} GB/s per GPU, below "
                   f"the target {shown(floor)}; {fix}", fs.urn)


STORAGE_POLICIES = [
    StackValidationPolicy(
        name="storage-no-reformat",
        description="Checks that no storage target sets reformat outside the environments that allow it.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_reformat), config_schema=_REFORMAT_SCHEMA),
    StackValidationPolicy(
        name="storage-servers-protected",
        description="Checks that the commands that set up storage servers are protected.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_servers_protected)),
    StackValidationPolicy(
        name="storage-raid-redundancy",
        description="Checks that every storage target sits on RAID-6 or another redundant level.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_raid), config_schema=_RAID_SCHEMA),
    StackValidationPolicy(
        name="storage-bandwidth-per-gpu",
        description="Checks that the filesystem's aggregate read bandwidth per GPU reaches the stack's target.",
        enforcement_level=EnforcementLevel.ADVISORY, validate=guarded(_bandwidth), config_schema=_BANDWIDTH_SCHEMA),
]
