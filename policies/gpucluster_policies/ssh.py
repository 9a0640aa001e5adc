"""SSH and secrets: every host and bastion is verified by its pinned key; no key material outside a connection."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import EnforcementLevel, ReportViolation, ResourceValidationArgs, ResourceValidationPolicy
from pulumi_policy.proxy import UnknownValueError

from .common import REMOTE_COMMAND, REMOTE_COPY, SecretStr, guarded, mapping

# Private key material in the formats tools write: PEM (PKCS#1 RSA, SEC1 EC, DSA, PKCS#8 plain and encrypted,
# OpenSSH's own), OpenPGP's armored secret key, PuTTY's .ppk.
_KEY_BLOCK = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-[0-9]+:")
# The same, base64-encoded once more (a ConfigMap's binaryData, a value pasted from `base64 -w0 key.pem`).
_BASE64 = re.compile(r"[A-Za-z0-9+/]{60,}={0,2}")


def _host_key_pinned(args: ResourceValidationArgs, report: ReportViolation) -> None:
    if args.resource_type not in (REMOTE_COMMAND, REMOTE_COPY):     # a copy's files are run as root later
        return
    conn = mapping(args.props.get("connection"))
    if not conn.get("hostKey"):
        report(f"connects to {conn.get('host')} without a pinned host key, so anyone answering on that address gets "
               "the script (and sudo); set host_key for that host or switch in the spec")
    proxy = mapping(conn.get("proxy"))
    if proxy and not proxy.get("hostKey"):
        report(f"goes through bastion {proxy.get('host')} without a pinned host key; set ssh.bastion.host_key")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every known string under `value`; a value not known yet (during preview) holds no key we could see."""
    if isinstance(value, str):
        yield path, value
        return
    keys = list(value) if isinstance(value, Mapping) else range(len(value)) if isinstance(value, Sequence) else ()
    for k in keys:
        try:
            item = value[k]
        except UnknownValueError:
            continue
        yield from _strings(item, f"{path}.{k}" if isinstance(value, Mapping) and path else
                            str(k) if isinstance(value, Mapping) else f"{path}[{k}]")


_KEY_FIELDS = {"connection.privateKey", "connection.proxy.privateKey"}
# pulumi-kubernetes makes a Secret's data and stringData Pulumi secrets whatever the program passes (its SDK wraps
# them in Output.secret; pulumi/pulumi-kubernetes#803, #1190): masked in previews, encrypted in the state.
_SECRET_FIELDS = {"kubernetes:core/v1:Secret": ("data.", "stringData.")}


def _has_key(text: str) -> bool:
    if _KEY_BLOCK.search(text):
        return True
    # The quick test runs on the text without whitespace too: a wrapped encoding (76 or 64 columns, as
    # `base64` and PEM tools write it) can break "LS0t" over a line end.
    flat = re.sub(r"\s+", "", text)
    for run in _BASE64.findall(flat) if "LS0t" in flat or "UHVUVFk" in flat else ():
        try:
            decoded = base64.b64decode(run + "=" * (-len(run) % 4)).decode("latin-1")
        except ValueError:
            continue
        if _KEY_BLOCK.search(decoded):
            return True
    return False


def _no_key_material(args: ResourceValidationArgs, report: ReportViolation) -> None:
    """A key in a Pulumi secret (a SecretStr: encrypted in the state, masked in logs) or where a key belongs (a
    connection's privateKey, a Kubernetes Secret's data, which the provider makes secret) is kept; anywhere
    else a key in the clear is a leak."""
    secret_fields = _SECRET_FIELDS.get(args.resource_type, ())
    for path, text in _strings(args.props, ""):
        if isinstance(text, SecretStr) or path in _KEY_FIELDS or path.startswith(secret_fields):
            continue
        if _has_key(text):
            report(f"carries a private key in {path}, where it ends up in plan files, state and "
                   "logs; pass keys only as an SSH connection's privateKey from a Pulumi secret, or in a "
                   "Kubernetes Secret's data")


SSH_POLICIES = [
    ResourceValidationPolicy(
        name="ssh-host-key-pinned",
        description="Checks that every SSH connection (and bastion) pins the host key.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_host_key_pinned)),
    ResourceValidationPolicy(
        name="secrets-no-key-material",
        description="Checks that no private key appears anywhere but an SSH connection's privateKey.",
        enforcement_level=EnforcementLevel.MANDATORY, validate=guarded(_no_key_material)),
]
