"""Building blocks shared by every part of the cluster spec."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# RFC 1123 subdomain: what Kubernetes accepts for node names and most object names.
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


Loc = tuple[str | int, ...]


class Problem(NamedTuple):
    loc: Loc
    message: str


class CrossFieldError(ValueError):
    """Carries problems, each with its own path, through pydantic's ValidationError (see loader._describe)."""

    def __init__(self, problems: list[Problem]):
        super().__init__("; ".join(p.message for p in problems))
        self.problems = problems


def field_error(field: str, message: str) -> CrossFieldError:
    """An error a model validator raises about one of its own fields, so the path points at that field."""
    return CrossFieldError([Problem((field,), message)])


class SpecModel(BaseModel):
    """Base of every spec model: immutable, and unknown keys are errors (typos never pass silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=False)


def _dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL_RE.match(value):
        raise ValueError(
            f"{value!r} is not a DNS label: use at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. 'team-a')")
    return value


def _dns_subdomain(value: str) -> str:
    if len(value) > 253 or not DNS_SUBDOMAIN_RE.match(value):
        raise ValueError(
            f"{value!r} is not a valid host name: use lowercase letters, digits, '-' and '.', "
            "each part starting and ending with a letter or digit (e.g. 'gpu-node-01')")
    return value


def _ip_address(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 or IPv6 address (e.g. '10.0.0.11')") from None


def _host_or_ip(value: str) -> str:
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        return _dns_subdomain(value)


def _label_key(value: str) -> str:
    if not LABEL_KEY_RE.match(value) or len(value.rsplit("/", 1)[-1]) > 63:
        raise ValueError(f"{value!r} is not a Kubernetes label key (e.g. 'example.com/team')")
    return value


def _label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE_RE.match(value):
        raise ValueError(f"{value!r} is not a Kubernetes label value: at most 63 letters, digits, '-', '_', '.'")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
HostName = Annotated[str, AfterValidator(_dns_subdomain)]
IpAddress = Annotated[str, AfterValidator(_ip_address)]
HostOrIp = Annotated[str, AfterValidator(_host_or_ip)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Labels = dict[LabelKey, LabelValue]


class Taint(SpecModel):
    """A Kubernetes node taint; pods need a matching toleration to land on the node."""

    key: LabelKey
    value: LabelValue = Field("", description="Omitted: the taint has no value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="Omitted: NoSchedule (running pods stay, new ones need a toleration).")
