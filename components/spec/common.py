"""Building blocks shared by every part of the cluster spec.

Every string that can reach a script or a Kubernetes object has a type here that holds it to the grammar of
what it is (a host name, an interface, a device path, a user, an image reference), so nothing a shell would
interpret gets past validation; scripts quote them as well.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from collections import Counter
from typing import Annotated, Any, Callable, ClassVar, Iterable, Iterator, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# RFC 1123 subdomain: what Kubernetes accepts for node names and most object names.
DNS_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_KEY_RE = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# Linux network interface names (IFNAMSIZ: 15 characters).
INTERFACE_RE = re.compile(r"[a-zA-Z][a-zA-Z0-9_.-]{0,14}")
# Switch port names: swp1s0 (Cumulus), Ethernet1/1 (EOS), Ethernet0 (SONiC), 1/1/1 styles.
PORT_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9/_.:-]{0,31}")
# Login names as useradd accepts them by default (plus '.', common in directory-backed accounts).
USER_RE = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")
PATH_RE = re.compile(r"/[A-Za-z0-9/_.+-]*")
# An OCI image reference: [registry[:port]/]path[:tag][@digest], as the distribution reference grammar has it.
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_RE = re.compile(rf"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                      rf"(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                      r"(?:@[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[0-9a-fA-F]{32,})?")
URL_RE = re.compile(r"(https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?|file://)(/[A-Za-z0-9/_.~%+-]*)?")
# Where a Helm chart comes from: a chart repository (https) or an OCI registry path (oci://host/path).
CHART_REPO_RE = re.compile(r"(https?|oci)://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9/_.~%+-]*)?")
# A registry mirror: host[:port][/path], the prefix images are pulled through.
REGISTRY_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                         rf"(?::[0-9]{{1,5}})?(?:/{_PATH_PART})*")
RELPATH_RE = re.compile(r"(?!/)(?!.*(?:^|/)\.\.(?:/|$))[A-Za-z0-9_.+-]+(?:/[A-Za-z0-9_.+-]+)*")
APT_WORD_RE = re.compile(r"\./|[A-Za-z0-9][A-Za-z0-9._-]*")     # ./ is a flat repository
VERSION_RE = re.compile(r"[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
LDAP_URI_RE = re.compile(r"ldaps?://[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/?")
# An LDAP distinguished name of attribute=value parts; values without the characters RFC 4514 escapes.
_RDN = r"[A-Za-z][A-Za-z0-9-]*=[^,=+<>#;\\\"\x00-\x1f\x7f]+"
DN_RE = re.compile(rf"{_RDN}(?:,{_RDN})*")


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


# Bounded scheme and userinfo keep the scan linear on a huge value.
_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]{0,31}://)[^/@\s'\"]{1,512}@")


def shown(value: object, limit: int = 60) -> str:
    """A value as written, cut so that a huge one never floods a message, and with any credentials in a URL
    (scheme://user:password@host) hidden: messages end up in CI logs."""
    text = repr(value)
    if "://" in text:
        text = _CREDENTIALS.sub(r"\1***@", text)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__
    return f"{text[:limit]}... ({size})"


def why(e: OSError | ValueError) -> str:
    """Why a path could not be read, in the system's words (a NUL byte in a path is a ValueError, not an OSError)."""
    return getattr(e, "strerror", None) or "not a valid path"


# --- rules that span fields, run even where other parts of the spec failed ---------------------------

class Tainted(Exception):
    """A rule used a value that failed validation; the rest of that rule is skipped (its inputs are wrong)."""


class Invalid:
    """Stands for a value that failed validation while the other rules run: any use of it raises Tainted, so a
    rule reports only what it could judge from valid values (see loader.partial)."""

    __slots__ = ("loc",)

    def __init__(self, loc: Loc):
        object.__setattr__(self, "loc", loc)

    def _taint(self, *args: Any, **kwargs: Any) -> Any:
        raise Tainted(self.loc)

    __getattr__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = _taint
    __str__ = __repr__ = __format__ = __iter__ = __len__ = __contains__ = __getitem__ = _taint
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = _taint
    __floordiv__ = __rfloordiv__ = __mod__ = __neg__ = __int__ = __float__ = __index__ = _taint
    __lshift__ = __rshift__ = __and__ = __rand__ = __or__ = __ror__ = __call__ = _taint


def valid(value: object) -> bool:
    return not isinstance(value, Invalid)


Check = Callable[[Any], Iterable[Problem]]


def run_checks(model: BaseModel, partial: bool = False) -> list[Problem]:
    """Every problem each of the model's checks finds. On a partly invalid model (`partial`) a check that reaches
    an invalid value stops there, also where it handed one to a model (which refuses it) or to a builtin that
    checks types without calling a method (`", ".join`: "expected str instance, Invalid found"; `str.startswith`:
    "... not Invalid")."""
    skip: tuple[type[Exception], ...] = (Tainted, ValidationError) if partial else (Tainted,)
    out: list[Problem] = []
    for check in getattr(type(model), "_checks", ()):
        try:
            for problem in check(model):
                out.append(problem)
        except skip:
            pass
        except TypeError as e:
            if not (partial and re.search(rf"\b{Invalid.__name__}\b", str(e))):
                raise
    return out


def duplicates(items: list[tuple[Loc, str]], what: str, fix: str) -> Iterator[Problem]:
    """Every repeat of a value that must be unique, at its own path, naming where it was first used."""
    items = [(loc, v) for loc, v in items if valid(v)]
    counts = Counter(v for _, v in items)
    first: dict[str, Loc] = {}
    for loc, v in items:
        if counts[v] > 1:
            if v in first:
                yield Problem(loc, f"{what} {v!r} is already used at {fmt_loc(first[v])}; {fix}")
            else:
                first[v] = loc


def fmt_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class SpecModel(BaseModel):
    """Base of every spec model: immutable; unknown keys are errors (typos never pass silently); values keep
    their YAML type (`"8"` is not a number, `yes` is not a rail); no NaN or infinity.

    Rules spanning fields are the functions in `_checks`; all of them run, and each reports every problem.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=False, strict=True,
                              allow_inf_nan=False)
    _checks: ClassVar[tuple[Check, ...]] = ()

    @model_validator(mode="after")
    def _run_checks(self) -> Any:
        problems = run_checks(self)
        if problems:
            raise CrossFieldError(problems)
        return self


# --- grammars -----------------------------------------------------------------------------------------

_PORT_RE = re.compile(r"^(?:[a-z]+://)?[^/:@]+:([0-9]+)")


def _grammar(rx: re.Pattern[str], what: str, example: str, max_len: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        if _CREDENTIALS.search(value):
            raise ValueError(f"{shown(value)} holds credentials (user:password@), which would land in the plan, "
                             "the state and CI logs: give the URL without them and log in to the registry or "
                             "repository on the machine that runs `pulumi up`")
        if len(value) > max_len or not rx.fullmatch(value):
            raise ValueError(f"{shown(value)} is not {what} (e.g. {example!r})")
        port = _PORT_RE.match(value)
        if port and not 0 < int(port.group(1)) < 65536:
            raise ValueError(f"{shown(value)} names port {port.group(1)}, which no server listens on (ports are "
                             "1 to 65535); fix the port or leave it out for the scheme's default")
        return value
    return check


def _dns_label(value: str) -> str:
    if len(value) > 63 or not DNS_LABEL_RE.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a DNS label: use at most 63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. 'team-a')")
    return value


def _host_name(value: str) -> str:
    # 63, not DNS's 253: a host name is also the value of the kubernetes.io/hostname label.
    if len(value) > 63 or not DNS_SUBDOMAIN_RE.fullmatch(value):
        raise ValueError(
            f"{shown(value)} is not a valid host name: use at most 63 lowercase letters, digits, '-' and '.', "
            "each part starting and ending with a letter or digit (e.g. 'gpu-node-01'); it is also a "
            "Kubernetes label value")
    return value


def _ip_address(value: str) -> str:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        raise ValueError(f"{shown(value)} is not an IPv4 or IPv6 address (e.g. '10.0.0.11')") from None
    kind = next((k for k, bad in (("an unspecified", address.is_unspecified), ("a loopback", address.is_loopback),
                                  ("a multicast", address.is_multicast),
                                  ("the broadcast", str(address) == "255.255.255.255")) if bad), None)
    if kind:
        raise ValueError(f"{value} is {kind} address, which no other machine can reach; use the machine's "
                         "management address")
    return str(address)


def _host_or_ip(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return _host_name(value)
    return _ip_address(value)


def _label_key(value: str) -> str:
    if not LABEL_KEY_RE.fullmatch(value) or len(value.rsplit("/", 1)[-1]) > 63 or len(value) > 316:
        raise ValueError(f"{shown(value)} is not a Kubernetes label key (e.g. 'example.com/team')")
    return value


def _label_value(value: str) -> str:
    if len(value) > 63 or not LABEL_VALUE_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a Kubernetes label value: at most 63 letters, digits, '-', '_', "
                         "'.', starting and ending with a letter or digit")
    return value


def _not_owned(owners: dict[str, str]) -> Callable[[dict[str, str]], dict[str, str]]:
    """Labels the spec may add, refusing keys someone else sets (a key ending in '/' is a whole prefix): the owner
    would silently replace the spec's value, or the spec's would break what selects by it."""
    def check(labels: dict[str, str]) -> dict[str, str]:
        taken = [f"{shown(k)} ({who})" for k in labels for key, who in owners.items()
                 if k == key or (key.endswith("/") and k.startswith(key))]
        if taken:
            raise ValueError(f"{', '.join(taken[:5])} {'is' if len(taken) == 1 else 'are'} set by the platform, "
                             "which would replace the value given here; choose a key under your own prefix "
                             "(e.g. example.com/team)")
        return labels
    return check


def _abs_path(value: str) -> str:
    if len(value) > 1024 or not PATH_RE.fullmatch(value) or (value != "/" and value.endswith("/")) \
            or posixpath.normpath(value) != value or ".." in value.split("/"):
        raise ValueError(f"{shown(value)} is not an absolute path in normal form: start with '/', no '..', '.', "
                         f"'//' or trailing '/', only letters, digits and '/_.+-' (e.g. "
                         f"{posixpath.normpath(value) if value.startswith('/') else '/mnt/data'!r})")
    return value


def _device_path(value: str) -> str:
    _abs_path(value)
    if not value.startswith("/dev/"):
        raise ValueError(f"{shown(value)} is not a device under /dev/ (e.g. '/dev/disk/by-id/nvme-...')")
    return value


def _group_name(value: str) -> str:
    if not value.strip() or value != value.strip() or CONTROL_RE.search(value) or len(value) > 256:
        raise ValueError(f"{shown(value)} is not an identity group name: give the group's name as the identity "
                         "provider sends it, without leading or trailing spaces or control characters")
    if value.startswith("system:"):
        raise ValueError(f"{shown(value)} is a Kubernetes system group (system:authenticated is every user, "
                         "system:masters and system:serviceaccounts the cluster's own): binding it hands the role "
                         "to all of them; name your identity provider's group")
    return value


def _text(value: str) -> str:
    if CONTROL_RE.search(value.replace("\n", "")) or len(value) > 1024:
        raise ValueError(f"{shown(value)} is not plain text of at most 1024 characters without control characters")
    return value


def _version(value: str) -> str:
    if len(value) > 64 or not VERSION_RE.fullmatch(value) or not re.search(r"[0-9]", value):
        raise ValueError(f"{shown(value)} is not a version: digits and letters separated by '.', '-' or '_' "
                         "(e.g. '25.04-0.6.1.0-2')")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
HostName = Annotated[str, AfterValidator(_host_name)]
IpAddress = Annotated[str, AfterValidator(_ip_address)]
HostOrIp = Annotated[str, AfterValidator(_host_or_ip)]
LabelKey = Annotated[str, AfterValidator(_label_key)]
LabelValue = Annotated[str, AfterValidator(_label_value)]
Labels = dict[LabelKey, LabelValue]
_LIBRARY = "this library"
NodeLabels = Annotated[Labels, AfterValidator(_not_owned({
    "gpucluster.io/": _LIBRARY, "nvidia.com/": "the GPU Operator and the pool's sharing settings",
    "feature.node.kubernetes.io/": "Node Feature Discovery", "node.kubernetes.io/": "Kubernetes",
    "beta.kubernetes.io/": "the kubelet", "kubernetes.io/hostname": "the kubelet", "kubernetes.io/os": "the kubelet",
    "kubernetes.io/arch": "the kubelet", "node-role.kubernetes.io/control-plane": "Kubernetes"}))]
NamespaceLabels = Annotated[Labels, AfterValidator(_not_owned({
    "gpucluster.io/": _LIBRARY, "app.kubernetes.io/managed-by": _LIBRARY,
    "pod-security.kubernetes.io/": "this library: tenants run under restricted pod security",
    "kubernetes.io/metadata.name": "the API server"}))]
InterfaceName = Annotated[str, AfterValidator(_grammar(INTERFACE_RE, "a network interface name", "ens1f0np0", 15))]
PortName = Annotated[str, AfterValidator(_grammar(PORT_NAME_RE, "a switch port name", "swp1", 32))]
UserName = Annotated[str, AfterValidator(_grammar(USER_RE, "a login name (lowercase letters, digits, '_.-')",
                                                  "ubuntu", 32))]
HardwareId = Annotated[str, AfterValidator(_grammar(
    re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"), "a serial number or asset tag (letters, digits, '._:/-')",
    "SN-7G2K4Q1", 64))]
ImageRef = Annotated[str, AfterValidator(_grammar(IMAGE_RE, "an image reference", "nvcr.io/nvidia/pytorch:25.01-py3",
                                                  255))]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
DevicePath = Annotated[str, AfterValidator(_device_path)]
GroupName = Annotated[str, AfterValidator(_group_name)]
Text = Annotated[str, AfterValidator(_text)]
LdapUri = Annotated[str, AfterValidator(_grammar(LDAP_URI_RE, "an LDAP server URI (ldaps:// or ldap://, host and "
                                                 "port only)", "ldaps://ldap.example.com", 255))]
GroupPrefix = Annotated[str, AfterValidator(_grammar(re.compile(r"[A-Za-z0-9:_.#@-]{0,64}"), "a group name prefix "
                                                      "(letters, digits, ':_.#@-')", "oidc:", 64))]
Dn = Annotated[str, AfterValidator(_grammar(DN_RE, "an LDAP distinguished name without escaped characters or "
                                            "spaces around its parts", "ou=people,dc=example,dc=com", 512))]
Version = Annotated[str, AfterValidator(_version)]
Url = Annotated[str, AfterValidator(_grammar(URL_RE, "an http(s) or file URL without query or spaces",
                                             "https://mirror.example.com/lustre/2.15/el9/client", 512))]
ChartRepo = Annotated[str, AfterValidator(_grammar(CHART_REPO_RE, "a chart repository (https://...) or OCI registry "
                                                 "(oci://...)", "oci://registry.example.internal/charts", 512))]
Registry = Annotated[str, AfterValidator(_grammar(REGISTRY_RE, "a registry host[:port][/path]",
                                                  "registry.example.internal/mirror", 255))]
RelPath = Annotated[str, AfterValidator(_grammar(RELPATH_RE, "a path inside the project (no leading /, no ..)",
                                                 "charts/gpu-operator", 255))]


PERCENT_RE = re.compile(r"(100|[1-9][0-9]?)%")


def _count_or_percent(value: Any) -> Any:
    """Checked before the union so a bad value gets one error, not one per member."""
    if (type(value) is int and 1 <= value <= 4096) or (type(value) is str and PERCENT_RE.fullmatch(value)):
        return value
    raise ValueError(f"{shown(value)} is neither a count of hosts from 1 to 4096 nor a percentage from 1% to 100% "
                     "(e.g. 2 or '10%')")


CountOrPercent = Annotated[
    int | Annotated[str, AfterValidator(_grammar(PERCENT_RE, "a percentage from 1% to 100%", "10%", 4))],
    BeforeValidator(_count_or_percent)]
AptWord = Annotated[str, AfterValidator(_grammar(APT_WORD_RE, "an apt suite or component", "jammy", 64))]


class PackageRepository(SpecModel):
    """The site's repository (or mirror) of the backend's packages for one OS family: the only place missing
    ones come from on hosts of that family."""

    os_family: Literal["el", "debian"] = Field(
        description="The hosts it serves: el (RHEL, Rocky, Alma: a dnf repository) or debian (Debian, Ubuntu, DGX "
                    "OS: an apt repository). A repository is of one format; EL servers and Ubuntu GPU hosts need "
                    "one each.")
    url: Url = Field(description="Base URL: the dnf baseurl (el) or the apt URI (debian).")
    gpg_key_url: Url | None = Field(None, description="Key its packages are signed with. Omitted: packages "
                                                     "are installed unchecked (a mirror you control only).")
    apt_suite: AptWord = Field("./", description="Debian/Ubuntu: the suite in the apt source line (e.g. jammy). "
                                                "Omitted: './', a flat repository.")
    apt_components: list[AptWord] = Field(default_factory=list, max_length=16,
                                          description="Components after the suite (e.g. [non-free]). Omitted: "
                                                      "none, as a flat repository has.")


class Taint(SpecModel):
    """A Kubernetes node taint; pods need a matching toleration to land on the node."""

    key: LabelKey
    value: LabelValue = Field("", description="Omitted: the taint has no value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "NoSchedule", description="Omitted: NoSchedule (running pods stay, new ones need a toleration).")
