"""Hostile and broken specs: never a traceback, never a hang, never a shell word from the spec, all problems at once.

Each class of bad input from issue 11 has its own tests here; the loader's budgets (aliases, depth, value size)
are checked with inputs that would hang or crash a plain YAML loader.
"""

from __future__ import annotations

import time
import typing

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from components.spec import ClusterSpec, SpecError, parse_spec
from components.spec.common import Invalid, Tainted
from components.spec.loader import MAX_VALUE_CHARS, _adapter, _field_type, _unwrap
from components.spec.kubernetes import PriorityClass
from components.spec.tenants import Groups
from tests.conftest import ROOT, problems_of

# --- the loader: encodings, YAML bombs, sizes, places -------------------------------------------------

def refused(text: str | bytes) -> list[str]:
    started = time.perf_counter()
    with pytest.raises(SpecError) as info:
        parse_spec(text, "spec.yaml")
    assert time.perf_counter() - started < 1.0, "bad input must be refused quickly"
    return info.value.problems


@pytest.mark.parametrize("data, line, byte", [
    ("name: café\n".encode("latin-1"), 1, "0xe9"),
    (b"name: dev\nenvironment: dev\n" + bytes(range(128, 256)), 3, "0x80"),
])
def test_a_file_that_is_not_utf8_is_named_with_its_line(data, line, byte):
    (msg,) = refused(data)
    assert msg.startswith(f"spec.yaml:{line}: byte {byte}") and "save the file as UTF-8" in msg


def test_an_alias_bomb_is_refused_at_once():
    levels = ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    (msg,) = refused("\n".join(levels) + "\n")
    assert "aliases expand this to more than 300,000 values" in msg


def test_too_many_aliases_are_refused():
    text = "x: &x 1\nl: [" + ", ".join(["*x"] * 300) + "]\n"
    (msg,) = refused(text)
    assert "more than 256 aliases" in msg


def test_a_self_referencing_alias_is_refused():
    (msg,) = refused("name: dev\nsites: &s [*s]\n")
    assert msg.startswith("spec.yaml:2: an alias refers to the collection it is in")


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deep_nesting_is_refused_without_recursion(depth):
    (msg,) = refused("name: " + "[" * depth + "]" * depth)
    assert "nested more than 64 levels deep" in msg


def test_a_huge_value_is_cut_in_the_message():
    (msg,) = refused("name: " + "x" * 10_000_000 + "\n")
    assert len(msg) < 400 and "10,000,000 characters" in msg and f"{MAX_VALUE_CHARS:,}" in msg


def test_a_long_but_legal_looking_value_is_cut_in_field_errors(dev_data):
    dev_data["name"] = "x" * 5000
    (msg,) = problems_of(dev_data)
    assert len(msg) < 400 and "(5000 characters)" in msg


def test_an_unclosed_bracket_names_the_line_it_opens_on():
    text = "name: dev\nenvironment: dev\nsites: [{name: lab1,\n  racks: []\nnode_pools: []\n"
    (msg,) = refused(text)
    assert msg.startswith("spec.yaml:3: not valid YAML: while parsing a flow mapping (line 3, column 9)")
    assert "did not find expected ',' or '}'" in msg


def test_a_control_character_is_named():
    (msg,) = refused("name: a\x07b\n")
    assert msg.startswith("spec.yaml:1: not valid YAML: character #x0007 is not allowed")


def test_a_second_document_is_refused():
    (msg,) = refused("name: dev\n---\nname: prod\n")
    assert "a second YAML document" in msg


def test_a_private_key_pasted_into_the_spec_names_the_secret_command(dev_data):
    dev_data["ssh"]["key"] = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXk=\n-----END OPENSSH PRIVATE KEY-----"
    (msg,) = problems_of(dev_data)
    assert "ssh.key: a private key never belongs in the spec" in msg
    assert "pulumi config set --secret sshPrivateKey < KEYFILE" in msg


# --- strict values: what YAML wrote is what the spec gets ---------------------------------------------

@pytest.mark.parametrize("path, value, expected", [
    (("node_pools", 0, "gpu", "count"), "8", "(got '8', a string); write the number without quotes"),
    (("node_pools", 0, "nics", 0, "rail"), True, "(got True: YAML reads yes, no, on, off, true and false as "
                                                 "booleans); write a number"),
    (("node_pools", 0, "burn_in", "enabled"), "yes", "(got 'yes'); write true or false, without quotes"),
    (("kubernetes", "kueue", "chart_version"), 0.19, "YAML read it as a number); put the value in quotes"),
    (("kubernetes", "kueue", "pods_recovery_timeout_s"), "300", "(got '300', a string); write the number without "
                                                                 "quotes"),
    (("sites", 0, "racks", 0, "pdu_capacity_kw"), float("nan"), "finite number"),
    (("sites", 0, "racks", 0, "pdu_capacity_kw"), float("inf"), "finite number"),
])
def test_values_keep_their_yaml_type(dev_data, path, value, expected):
    node = dev_data
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[path[-1]] = value
    (msg,) = problems_of(dev_data)
    assert expected in msg, msg


# --- the grammar of every string ------------------------------------------------------------------------

HOSTILE = ["ok$(reboot)", "ok;reboot", "ok`id`", "ok\nreboot", "ok|x", "ok&x", "ok x", "ok'x", 'ok"x', "ok>x",
           "../../etc/shadow"]
# Free text that only ever lands in a Kubernetes object field (never a script): see the plan test below.
FREE_TEXT = {(PriorityClass, "description"), (Groups, "admin"), (Groups, "edit"), (Groups, "view")}


def _string_slots(model: type[BaseModel], seen: set[type]) -> typing.Iterator[tuple[type, str, typing.Any]]:
    """(model, field, type) of every string-valued slot reachable from `model`, containers unwrapped."""
    if model in seen:
        return
    seen.add(model)
    for name in model.model_fields:
        pending = [_field_type(model, name)]
        while pending:
            tp = pending.pop()
            base = _unwrap(tp)
            if isinstance(base, type) and issubclass(base, BaseModel):
                yield from _string_slots(base, seen)
            elif typing.get_origin(base) in (list, dict):
                pending.extend(typing.get_args(base))
            elif typing.get_origin(base) in (typing.Union, type(int | str)):
                pending.extend(a for a in typing.get_args(base) if a is not type(None))
            elif base is str:
                yield model, name, tp


def test_every_string_in_the_spec_has_a_grammar_that_refuses_shell_words():
    slots = list(_string_slots(ClusterSpec, set()))
    assert len(slots) > 30, "the walk must reach the whole spec"
    for model, name, tp in slots:
        if (model, name) in FREE_TEXT:
            continue
        for value in HOSTILE:
            with pytest.raises(ValidationError):
                _adapter(tp).validate_python(value)
                pytest.fail(f"{model.__name__}.{name} accepts {value!r}; give it the grammar of what it is")


@pytest.mark.parametrize("path, value, expected", [
    (("fabric", "switches", 0, "port_names"), [f"swp{i}" for i in range(1, 32)] + ["swp32$(reboot)"],
     "fabric.switches[0].port_names[31]: 'swp32$(reboot)' is not a switch port name"),
    (("ssh", "user"), "ubuntu admin", "ssh.user: 'ubuntu admin' is not a login name"),
    (("node_pools", 0, "hosts", 0, "address"), "0.0.0.0", "0.0.0.0 is an unspecified address"),
    (("node_pools", 0, "hosts", 1, "address"), "127.0.0.1", "127.0.0.1 is a loopback address"),
    (("node_pools", 0, "burn_in", "nccl_tests_dir"), "/opt/../etc", "is not an absolute path in normal form"),
    (("node_pools", 0, "hosts", 0, "hostname"), "gpu-" + "a" * 60, "it is also a Kubernetes label value"),
    (("kubernetes", "network_operator", "ofed_driver_version"), "latest", "'latest' is not a version"),
    (("fabric", "checks", "nccl_tests_image"), "Not An Image", "'Not An Image' is not an image reference"),
    (("tenants", 0, "groups", "admin"), [""], "tenants[0].groups.admin[0]: '' is not an identity group name"),
    (("node_pools", 0, "dedicated_to"), "Team_A", "node_pools[0].dedicated_to: 'Team_A' is not a DNS label"),
    (("node_pools", 0, "dedicated_to"), 5, "node_pools[0].dedicated_to: Input should be a valid string (got 5"),
    (("validation", "fio_image"), "fio latest", "validation.fio_image: 'fio latest' is not an image reference"),
    (("node_pools", 0, "hosts", 0, "hardware_id"), "SN 1;reboot",
     "node_pools[0].hosts[0].hardware_id: 'SN 1;reboot' is not a serial number or asset tag"),
    (("node_pools", 0, "software", "doca_ofed_version"), "2.9.5 && reboot",
     "node_pools[0].software.doca_ofed_version: '2.9.5 && reboot' is not a version"),
    (("node_pools", 0, "software", "package_repositories"), [{"os_family": "debian", "url": "ftp://mirror/cuda"}],
     "node_pools[0].software.package_repositories[0].url: 'ftp://mirror/cuda' is not an http(s) or file URL"),
    (("node_pools", 0, "software", "driver_kernel_modules"), "nouveau",
     "node_pools[0].software.driver_kernel_modules: Input should be 'open' or 'proprietary'"),
])
def test_script_and_object_strings_are_held_to_their_grammar(dev_data, path, value, expected):
    node = dev_data
    for part in path[:-1]:
        node = node.setdefault(part, {}) if isinstance(part, str) else node[part]
    node[path[-1]] = value
    found = problems_of(dev_data)
    assert any(expected in m for m in found), found


def test_device_paths_outside_dev_or_with_dotdot_are_refused(dev_data):
    dev_data["storage"] = {"kind": "lustre", "mount_point": "/mnt/../etc", "servers": [
        {"hostname": "mds-01", "address": "10.10.0.50", "rack": "r01", "targets": [
            {"role": "mgs", "device": "/dev/../etc/shadow", "reformat": True},
            {"role": "mdt", "device": "/etc/passwd"},
            {"role": "ost", "device": "/dev/nvme0n1"}]}]}
    found = problems_of(dev_data)
    assert any("storage.mount_point: '/mnt/../etc' is not an absolute path in normal form" in m for m in found)
    assert any("targets[0].device: '/dev/../etc/shadow' is not an absolute path in normal form" in m for m in found)
    assert any("targets[1].device: '/etc/passwd' is not a device under /dev/" in m for m in found)


# --- bounds and cross-checks ------------------------------------------------------------------------------

def test_host_tuning_above_the_host_and_the_gpu_is_refused(dev_data):
    tuning = dev_data["node_pools"][0].setdefault("tuning", {})
    memory = dev_data["node_pools"][0]["memory_gib_per_host"]
    tuning.update(hugepages_2mi=memory * 512 + 1, shm_size_gib=memory + 1, gpu_power_limit_w=800)
    found = problems_of(dev_data)
    assert any("tuning.hugepages_2mi:" in m and f"more than the host's {memory} GiB" in m for m in found)
    assert any("tuning.shm_size_gib:" in m and f"larger than the host's {memory} GiB" in m for m in found)
    assert any("tuning.gpu_power_limit_w: power limit 800 W is above the H100-SXM5-80GB's 700 W" in m
               for m in found)


@pytest.mark.parametrize("value, problem", [
    ("64", "Input should be a valid integer"), (-1, "greater than or equal to 0"), (4097, "less than or equal to 4096"),
    (2048, "2048 GiB kept for the system, with 0 GiB of hugepages, leaves pods nothing of the host's 2048 GiB "
           "(memory_gib_per_host); keep less")])
def test_a_system_reservation_of_the_wrong_type_size_or_beyond_the_host_is_refused(dev_data, value, problem):
    dev_data["node_pools"][0]["tuning"]["system_reserved_memory_gib"] = value
    found = problems_of(dev_data)
    assert any("node_pools[0].tuning.system_reserved_memory_gib:" in m and problem in m for m in found), found


def test_a_driver_stack_that_cannot_be_installed_as_asked_is_refused_naming_each_field(dev_data):
    mirror = [{"os_family": "debian", "url": "https://mirror.example.internal/cuda/ubuntu2204/x86_64"}]
    dev_data["node_pools"][0]["software"] = {"package_repositories": mirror}
    found = problems_of(dev_data)
    assert any("node_pools[0].software.package_repositories: repositories to install from, but no version to "
               "install: set driver_version or doca_ofed_version" in m for m in found), found
    dev_data["node_pools"][0]["gpu"] = {"model": "B200-SXM6-180GB", "count": 8}
    dev_data["node_pools"][0]["software"] = {"package_repositories": mirror, "driver_version": "570.124.06",
                                             "driver_kernel_modules": "proprietary"}
    dev_data["kubernetes"].setdefault("gpu_operator", {})["driver_managed"] = True
    found = problems_of(dev_data)
    assert any("node_pools[0].software.driver_kernel_modules: B200-SXM6-180GB runs only with the driver's open "
               "kernel modules" in m for m in found), found
    assert any("node_pools[0].software.driver_version: node pool h100 installs driver 570.124.06 on its hosts "
               "(software.package_repositories), but the GPU Operator installs the driver" in m for m in found), found


def test_a_nic_faster_than_its_leaf_port_is_refused(dev_data):
    dev_data["node_pools"][0]["nics"][0]["speed_gbps"] = 800
    found = problems_of(dev_data)
    assert any("node_pools[0].nics[0].speed_gbps: rail 0 NICs of pool h100 run at 800 Gb/s but leaf" in m
               for m in found), found


def test_an_ethernet_switch_os_on_infiniband_is_refused():
    data = yaml.safe_load(open("stacks/prod.yaml"))
    data["fabric"]["switches"][0]["vendor"] = "sonic"
    found = problems_of(data)
    assert any("fabric.switches[0].vendor: ib-leaf-0 runs sonic, an Ethernet switch OS, but the fabric is "
               "InfiniBand" in m for m in found), found


def test_a_rack_drawing_more_than_its_pdu_is_refused(dev_data):
    dev_data["sites"][0]["racks"][0]["pdu_capacity_kw"] = 12
    dev_data["node_pools"][0]["host_base_power_w"] = 1500
    (msg,) = problems_of(dev_data)
    assert msg.split(": ", 1)[1] == (
        "sites[0].racks[0].pdu_capacity_kw: rack r01 draws 17.2 kW at peak (2 x 7.1 kW (h100 host) + 1 x 1.5 kW "
        "(leaf switch) + 1 x 1.5 kW (storage server); GPUs at TDP plus base power) but its PDUs deliver 12 kW; move "
        "hosts to another rack or correct pdu_capacity_kw")


# --- every problem at once ------------------------------------------------------------------------------

def test_rules_still_run_where_fields_are_invalid(dev_data):
    pool = dev_data["node_pools"][0]
    pool["colour"] = "red"                                    # unknown key
    pool["hosts"][0]["address"] = "10.10.0.300"               # bad address
    pool["hosts"][1]["rack"] = "r99"                          # missing rack (a cross-field rule)
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 40   # quota above capacity (another)
    found = problems_of(dev_data)
    assert [m.split(": ", 2)[1] for m in found] == [
        "node_pools[0].hosts[0].address", "node_pools[0].hosts[1].rack", "node_pools[0].colour",
        "tenants[0].gpu_quota.h100"], found


def test_rules_that_depend_on_an_invalid_value_are_skipped(dev_data):
    dev_data["node_pools"][0]["gpu"]["count"] = "8"            # the capacity rule needs the count
    dev_data["tenants"][0]["gpu_quota"]["h100"]["nominal"] = 40
    (msg,) = problems_of(dev_data)
    assert "gpu.count" in msg


def test_a_value_a_check_refused_causes_no_follow_on_problems(dev_data):
    dev_data["node_pools"][0]["gpu"]["count"] = 6              # not an H100 board; capacity would follow from it
    (msg,) = problems_of(dev_data)
    assert "hosts carry 4 or 8 GPUs, not 6" in msg


def test_a_rule_that_joins_an_invalid_name_is_skipped_not_crashed(dev_data):
    dev_data["node_pools"][0]["name"] = None                   # the RoCE rule joins pool names into its message
    dev_data["kubernetes"] = {}
    (msg,) = problems_of(dev_data)
    assert "node_pools[0].name: Input should be a valid string" in msg


def test_an_invalid_stand_in_refuses_every_use():
    bad = Invalid(("x",))
    for use in (lambda: bad == 1, lambda: hash(bad), lambda: bool(bad), lambda: f"{bad}", lambda: bad.name,
                lambda: bad + 1, lambda: list(bad), lambda: 1 in bad, lambda: bad < 2):
        with pytest.raises(Tainted):
            use()


# --- never anything but SpecError ---------------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

from tests.conftest import _DEV, with_changes  # noqa: E402

_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=True),
                     st.text(max_size=40), st.sampled_from(["", "0.0.0.0", "/dev/../x", "$(reboot)", "yes", "8"]))
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=8)


def _paths(node, loc=()):
    yield loc
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, loc + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, loc + (i,))


_DEV_PATHS = [p for p in _paths(_DEV) if p]


def _only_spec_errors(text) -> None:
    try:
        parse_spec(text, "spec.yaml")
    except SpecError as e:
        assert e.problems and all(p.startswith("spec.yaml") and len(p) < 2000 for p in e.problems), e.problems


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(_DEV_PATHS), _VALUES), min_size=1, max_size=4))
def test_any_value_anywhere_in_the_dev_spec_gives_problems_not_a_crash(changes):
    _only_spec_errors(yaml.safe_dump(with_changes(_DEV, changes), allow_unicode=True))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200),
                 st.text(alphabet="{}[]&*!|>-:,'\"#%@`?\n\t abc012", max_size=200)))
def test_any_text_gives_problems_not_a_crash(text):
    _only_spec_errors(text)


def test_a_quota_map_with_an_empty_key_and_a_null_quota_gives_problems_not_a_crash(dev_data):
    """Found by the fuzzer: a count-or-quota value is a model inside Annotated, whose own config must be kept."""
    dev_data["tenants"][1]["gpu_quota"] = {"": None, "0": 0}
    found = [m.split(": ", 1)[1] for m in problems_of(dev_data)]
    assert "tenants[1].gpu_quota.: expected a mapping (key: value), got None" in found
    assert any(m.startswith("tenants[1].gpu_quota.0: no node pool named '0'") for m in found)


def _edit(path, value):
    def change(data):
        node = data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node.get(path[-1]) if isinstance(node, dict) else node[path[-1]]) \
            if callable(value) else value
    return change


SECOND_ROUND = [   # what reaches a host or the cluster is checked against what the tool it reaches accepts
    (lambda d: d["storage"]["servers"][0]["targets"].append(dict(d["storage"]["servers"][0]["targets"][-1], index=9)),
     "storage.servers[0].targets[4].device: stor-dev-01 has two targets on /dev/disk/by-id/nvme-stor102"),
    (_edit(("storage", "mount_point"), "/"), "storage.mount_point: / is a system directory"),
    (_edit(("storage", "mount_point"), "/etc/gpufs"), "storage.mount_point: /etc/gpufs is a system directory"),
    (_edit(("storage", "datasets"), [{"name": "common", "stripe_size_mib": 3}]),
     "storage.datasets[0].stripe_size_mib: BeeGFS chunk sizes are powers of two (64 KiB and up); 3 MiB is not: "
     "use 2 or 4"),
    (_edit(("storage", "datasets"), [{"name": "common"}, {"name": "common"}]),
     "storage.datasets[1].name: dataset common is listed twice (datasets 0 and 1); give each its own name"),
    (_edit(("storage", "package_repositories"), [{"os_family": "debian", "url": "https://mirror.example:99999/x"}]),
     "storage.package_repositories[0].url: 'https://mirror.example:99999/x' names port 99999, which no server "
     "listens on"),
    (_edit(("node_pools", 0, "tuning", "kubelet_reserved_cpus"), "7-3"),
     "node_pools[0].tuning.kubelet_reserved_cpus: '7-3': the range 7-3 runs high to low"),
    (_edit(("tenants", 0, "groups"), {"edit": ["system:authenticated"]}),
     "tenants[0].groups.edit[0]: 'system:authenticated' is a Kubernetes system group"),
    (_edit(("kubernetes", "kueue", "pods_ready_timeout_s"), 10),
     "kubernetes.kueue.pods_ready_timeout_s: Input should be greater than or equal to 60 (got 10)"),
    (_edit(("kubernetes", "kueue", "pods_recovery_timeout_s"), 200000),
     "kubernetes.kueue.pods_recovery_timeout_s: Input should be less than or equal to 86400 (got 200000)"),
    (lambda d: d["fabric"].setdefault("checks", {}).update(nccl_min_busbw_gb_per_s=900),
     "fabric.checks.nccl_min_busbw_gb_per_s: an NCCL floor of 900 GB/s is more than pool h100 can carry"),
]


@pytest.mark.parametrize("change, message", SECOND_ROUND, ids=[m.split(":")[0] for _, m in SECOND_ROUND])
def test_what_would_damage_a_host_or_the_cluster_is_refused_by_validate_and_plan_alike(dev_data, change, message,
                                                                                     tmp_path):
    change(dev_data)
    refused_alike(dev_data, message, tmp_path)


def refused_alike(data, message, tmp_path) -> None:
    """The loader names the problem, and validate and plan both refuse the file with it (exit 2, no traceback),
    plan writing nothing."""
    found = [m.split(": ", 1)[1] for m in problems_of(data)]
    assert any(m.startswith(message) for m in found), found
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    from tests.cli.test_cli import gpucluster
    for command in ("validate", "plan"):
        out = gpucluster(command, str(spec_file), *(["--out", str(tmp_path / "o")] if command == "plan" else []))
        assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, (command, out.stderr)
    assert not (tmp_path / "o").exists()


def test_a_vendored_chart_that_is_not_in_the_project_is_refused_with_its_line(tmp_path):
    from components.spec.loader import load_spec
    (tmp_path / "Pulumi.yaml").write_text("name: gpucluster\nruntime: python\n")
    (tmp_path / "stacks").mkdir()
    data = yaml.safe_load((ROOT / "stacks" / "dev.yaml").read_text())
    data["kubernetes"]["kueue"] = {"chart_path": "charts/kueue"}
    spec_file = tmp_path / "stacks" / "dev.yaml"
    spec_file.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as e:
        load_spec(spec_file)
    [problem] = e.value.problems
    assert ": kubernetes.kueue.chart_path: charts/kueue has no Chart.yaml in the project" in problem
    assert problem.startswith(f"{spec_file}:") and problem.split(":")[1].isdigit()
    (tmp_path / "charts" / "kueue").mkdir(parents=True)
    (tmp_path / "charts" / "kueue" / "Chart.yaml").write_text("name: kueue\nversion: 0.19.2\n")
    assert load_spec(spec_file).kubernetes.kueue.chart_path == "charts/kueue"


def test_credentials_in_a_url_are_refused_and_never_echoed(dev_data):
    dev_data["kubernetes"]["kueue"] = {"chart_repository": "oci://robot:hunter2@registry.example/charts"}
    [problem] = problems_of(dev_data)
    assert "hunter2" not in problem and "robot" not in problem
    assert "kubernetes.kueue.chart_repository: 'oci://***@registry.example/charts' holds credentials" in problem


# --- class 2: a value the platform would replace or cut down is refused, never silently different ---------

def test_labels_the_platform_sets_are_refused_on_nodes_and_namespaces(dev_data):
    dev_data["node_pools"][0]["labels"] = {"gpucluster.io/pool": "other", "nvidia.com/gpu.product": "H100",
                                           "kubernetes.io/hostname": "x", "example.com/team": "ml"}
    dev_data["tenants"][0]["labels"] = {"pod-security.kubernetes.io/enforce": "privileged",
                                        "kubernetes.io/metadata.name": "x", "example.com/cost-center": "42"}
    found = [p.split(": ", 1)[1] for p in problems_of(dev_data)]
    assert len(found) == 2
    nodes, namespace = found
    assert nodes.startswith("node_pools[0].labels: 'gpucluster.io/pool' (this library), 'nvidia.com/gpu.product' "
                            "(the GPU Operator and the pool's sharing settings), 'kubernetes.io/hostname' (the "
                            "kubelet) are set by the platform")
    assert namespace.startswith("tenants[0].labels: 'pod-security.kubernetes.io/enforce' (this library: tenants run "
                                "under restricted pod security), 'kubernetes.io/metadata.name' (the API server) are "
                                "set by the platform")
    assert "cost-center" not in namespace and "example.com/team' (" not in nodes


def test_an_nccl_check_wider_than_a_pool_is_refused_not_cut_down(dev_data):
    dev_data["fabric"].setdefault("checks", {})["nccl_hosts"] = 3
    [problem] = problems_of(dev_data)
    assert problem.endswith("fabric.checks.nccl_hosts: 3 nodes for the NCCL check, but node pool(s) h100 (2) hold "
                            "fewer; use at most 2, or omit it to run the check on every host of each pool")
    dev_data["fabric"]["checks"]["nccl_hosts"] = 2
    assert problems_of(dev_data) == []


def _named_lists(node, loc=()):
    """Paths of every list of named things (items with a name or hostname) in a spec."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _named_lists(v, loc + (k,))
    elif isinstance(node, list):
        if node and isinstance(node[0], dict) and ("name" in node[0] or "hostname" in node[0]):
            yield loc
        for i, v in enumerate(node):
            yield from _named_lists(v, loc + (i,))


_STACKS = {s: yaml.safe_load((ROOT / "stacks" / f"{s}.yaml").read_text()) for s in ("dev", "staging", "prod")}


@pytest.mark.parametrize("stack, path", [(s, p) for s, d in _STACKS.items() for p in _named_lists(d)],
                         ids=lambda x: x if isinstance(x, str) else ".".join(map(str, x)))
def test_an_item_listed_twice_is_refused_by_validation_not_by_the_engine(stack, path):
    """Class 3: every uniqueness rule lives in the spec's validation, so `validate` refuses what `plan` would
    fail on with duplicate URNs, for every list of named things in every stack."""
    import copy
    data = copy.deepcopy(_STACKS[stack])
    node = data
    for part in path:
        node = node[part]
    node.append(copy.deepcopy(node[0]))
    assert problems_of(data), f"{stack}: a second {'.'.join(map(str, path))}[0] passed validation"
