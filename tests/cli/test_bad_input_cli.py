"""Bad input through the command line: exit 2, a message naming the file and the fix, never a traceback."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import yaml

from tests.cli.test_cli import gpucluster
from tests.conftest import ROOT

PRIVATE_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\\n  b3BlbnNzaC1rZXktdjE=\\n  -----END OPENSSH PRIVATE KEY-----"


@pytest.fixture
def project(tmp_path):
    for name in ("Pulumi.yaml", "Pulumi.dev.yaml", "Pulumi.prod.yaml", "__main__.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    return tmp_path


def refused(out) -> str:
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr
    return out.stderr


def test_plan_takes_a_spec_file_path_as_the_stack_its_name_names(project, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("specs") / "lab.yaml"
    shutil.copy(project / "stacks" / "dev.yaml", elsewhere)
    for arg, stack in (("stacks/dev.yaml", "dev"), (str(elsewhere), "lab")):
        out = gpucluster("plan", arg, cwd=project)
        assert out.returncode == 0, out.stderr
        assert f"Stack {stack} of project gpucluster" in out.stdout
        assert (project / "build" / stack / "resources.json").exists()


def test_a_spec_file_whose_name_is_no_stack_name_is_refused(project):
    shutil.copy(project / "stacks" / "dev.yaml", project / "my lab.yaml")
    assert "'my lab' is not a stack name" in refused(gpucluster("plan", "my lab.yaml", cwd=project))


@pytest.mark.parametrize("content", ["{not json", "[]", '{"resources": {}}', '{"resources": [{"name": "x"}]}',
                                     '{"resources": [{"urn": "u"}]}',
                                     '{"resources": [{"urn": "urn:pulumi:s::p::t::n", "inputs": []}]}', "\udcff",
                                     # an id of its own: TEST_ID_MAX in tests/conftest.py
                                     pytest.param("[" * 100000 + "]" * 100000, id="nested-100000-deep"),
                                     '{"resources": [{"urn": "urn:pulumi:s::p::t::n"}, {"urn": "urn:pulumi:s::p::t::n"}]}',
                                     '{"resources": [{"urn": "urn:pulumi:s::p::t::n", "dependsOn": {"a": 1}}]}'])
def test_diff_of_a_damaged_plan_is_bad_input(tmp_path, content):
    good = tmp_path / "good"
    good.mkdir()
    (good / "resources.json").write_text(json.dumps({"resources": [], "outputs": {}}))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "resources.json").write_bytes(content.encode("utf-8", "surrogateescape"))
    for old, new in ((good, bad), (bad, good)):
        err = refused(gpucluster("diff", str(old), str(new)))
        assert f"{bad / 'resources.json'}" in err and "run `gpucluster plan STACK --out" in err


def test_a_plain_private_key_in_stack_settings_warns_in_dev_and_is_refused_elsewhere(project):
    (project / "Pulumi.dev.yaml").write_text(f'config:\n  gpucluster:sshPrivateKey: "{PRIVATE_KEY}"\n')
    out = gpucluster("plan", "dev", cwd=project)
    assert out.returncode == 0, out.stderr
    assert "gpucluster:sshPrivateKey is in plain text" in out.stderr
    assert "pulumi config set --secret sshPrivateKey < KEYFILE" in out.stderr
    (project / "Pulumi.prod.yaml").write_text(f'config:\n  gpucluster:sshPrivateKey: "{PRIVATE_KEY}"\n')
    for command in ("validate", "plan"):
        assert "(refused in prod)" in refused(gpucluster(command, "prod", cwd=project))
    assert not (project / "build" / "prod").exists()


def test_a_plain_directory_password_in_stack_settings_is_reported_though_no_stack_declares_it(project):
    (project / "Pulumi.prod.yaml").write_text('config:\n  gpucluster:slurmDirectoryPassword: "hunter2-bind"\n')
    err = refused(gpucluster("validate", "prod", cwd=project))
    assert "gpucluster:slurmDirectoryPassword is in plain text" in err and "(refused in prod)" in err
    assert "pulumi config set --secret slurmDirectoryPassword < FILE" in err


def test_a_directory_password_sssd_cannot_carry_is_refused_by_validate_and_plan_without_echoing_it(project):
    config = yaml.safe_load((project / "Pulumi.dev.yaml").read_text()) or {}
    config.setdefault("config", {})["gpucluster:slurmDirectoryPassword"] = "first-line\nsecond-line"
    (project / "Pulumi.dev.yaml").write_text(yaml.safe_dump(config))
    for command in ("validate", "plan"):
        err = refused(gpucluster(command, "dev", cwd=project))
        assert "gpucluster:slurmDirectoryPassword: slurmDirectoryPassword is empty, starts or ends with a space, " \
               "or holds a control character (a line break)" in err, err
        assert "first-line" not in err and "second-line" not in err
    assert not (project / "build" / "dev").exists()


def test_a_spec_outside_the_project_has_its_vendored_charts_looked_for_by_validate_as_by_plan(project,
                                                                                          tmp_path_factory):
    data = yaml.safe_load((project / "stacks" / "dev.yaml").read_text())
    data["kubernetes"].setdefault("kueue", {})["chart_path"] = "vendor/kueue"
    elsewhere = tmp_path_factory.mktemp("specs") / "lab.yaml"
    elsewhere.write_text(yaml.safe_dump(data, sort_keys=False))
    for command in ("validate", "plan"):
        err = refused(gpucluster(command, str(elsewhere), cwd=project))
        assert f"kubernetes.kueue.chart_path: vendor/kueue has no Chart.yaml in the project ({project.resolve()})" \
            in err, (command, err)


def test_a_spec_that_is_a_device_is_read_no_further_than_a_spec_can_be(project):
    for command in ("validate", "plan"):
        started = time.monotonic()
        err = refused(gpucluster(command, "/dev/zero", cwd=project))
        assert "/dev/zero: more than 16,777,216 bytes, more than a spec can be (is this the right file?)" in err
        assert time.monotonic() - started < 30


def test_a_program_that_stops_with_a_run_error_is_bad_input_with_its_message(project):
    main = project / "__main__.py"
    main.write_text('import pulumi\nraise pulumi.RunError("stopped on purpose: set X")\n' + main.read_text())
    assert "error: stopped on purpose: set X" in refused(gpucluster("plan", "dev", cwd=project))
    assert not (project / "build" / "dev").exists()


def test_damaged_stack_settings_are_bad_input(project):
    (project / "Pulumi.dev.yaml").write_text("config: [unclosed\n")
    assert "Pulumi.dev.yaml: cannot be read as YAML" in refused(gpucluster("plan", "dev", cwd=project))


def test_spec_text_holding_the_scripts_heredoc_markers_plans(project):
    spec = project / "stacks" / "dev.yaml"
    names = ["GPUCLUSTER_SCRIPT", "GPUCLUSTER_EOF"] + [f"swp{i}" for i in range(3, 33)]
    spec.write_text(spec.read_text().replace("vendor: cumulus", f"vendor: cumulus\n      port_names: {names}"))
    out = gpucluster("plan", "dev", cwd=project)
    assert out.returncode == 0, out.stderr
    script = (project / "build" / "dev" / "scripts" / "leaf-dev-01" / "dev-fabric-leaf-dev-01.sh").read_text()
    assert "nv set interface GPUCLUSTER_SCRIPT,GPUCLUSTER_EOF,swp3,swp4," in script


def test_free_text_reaches_kubernetes_objects_only_never_a_script(project):
    payload = "x$(touch /tmp/pwned);`id`|y"
    spec = project / "stacks" / "dev.yaml"
    spec.write_text(spec.read_text().replace("description: Jobs that preempt experiments",
                                             f"description: '{payload}'")
                    .replace("edit: [oidc:team-a]", f"edit: ['{payload}']"))
    out = gpucluster("plan", "dev", cwd=project)
    assert out.returncode == 0, out.stderr
    build = project / "build" / "dev"
    holders = {p.relative_to(build).parts[0] for p in build.rglob("*") if p.is_file() and payload in p.read_text()}
    assert holders == {"manifests", "resources.json"}, holders


GOOD_KUBECONFIG = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
                   "clusters": [{"name": "k", "cluster": {"server": "https://10.0.0.1:6443"}}],
                   "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}], "users": [{"name": "u"}]}


@pytest.mark.parametrize("content, args, message", [
    (None, (), "cannot be read (No such file or directory)"),
    (b"\x00\xff\x00binary", (), "kubeconfig:1: byte 0xff at column 2 is not UTF-8"),
    (b"apiVersion: v1\nkind: Config\nkind: Config\n", (), "kubeconfig:3: kind: key 'kind' appears twice"),
    (b"a: &x [*x]\n", (), "an alias refers to the collection it is in"),
    (b"just: text\n", (), "not a kubeconfig (no kind: Config with a list of clusters)"),
    (yaml.safe_dump({**GOOD_KUBECONFIG, "current-context": "gone"}).encode(), (),
     "current-context 'gone' names no context with a cluster in the file, so kubectl would fall back to "
     "localhost:8080"),
    (yaml.safe_dump({**GOOD_KUBECONFIG, "clusters": [{"name": "k", "cluster": {}}]}).encode(), (),
     "cluster 'k' has server None; give the API server's https:// address"),
    (yaml.safe_dump(GOOD_KUBECONFIG).encode(), ("--timeout", "-5"),
     "--timeout: -5 is not a number of seconds a check may run; give 1 to 86400"),
    (yaml.safe_dump(GOOD_KUBECONFIG).encode(), ("--kubectl", "/nonexistent/kubectl"),
     "--kubectl: '/nonexistent/kubectl' is not an executable on PATH"),
])
def test_validate_refuses_cluster_access_it_cannot_use_at_once(tmp_path, content, args, message):
    """Exit 2 before any check runs (not every check failing after its SSH and kubectl attempts)."""
    kubeconfig = tmp_path / "kubeconfig"
    if content is not None:
        kubeconfig.write_bytes(content)
    started = time.monotonic()
    out = gpucluster("validate", "dev", "--kubeconfig", str(kubeconfig), *args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert "problem(s) in the cluster access" in out.stderr and "running" not in out.stdout
    assert time.monotonic() - started < 20


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["kubernetes"]["slurm"].update(pools="h100-slurm"), "kubernetes.slurm.pools"),          # not a list
    (lambda d: d["kubernetes"]["slurm"].update(priority_decay_half_life_h=0),
     "kubernetes.slurm.priority_decay_half_life_h"),                                                    # out of range
    (lambda d: d["kubernetes"]["slurm"].update(partition_max_time_h="1d"), "kubernetes.slurm.partition_max_time_h"),
    (lambda d: d["kubernetes"]["slurm"].update(namespace="Slurm Jobs"), "kubernetes.slurm.namespace"),
    (lambda d: d["kubernetes"]["slurm"].update(accounting={"database_port": 70000}),
     "kubernetes.slurm.accounting.database_port"),
    (lambda d: d["kubernetes"]["slurm"].update(accounting={"database_name": "acct; DROP TABLE"}),
     "kubernetes.slurm.accounting.database_name"),                                                      # hostile
    (lambda d: d["kubernetes"]["slurm"].update(pools=["h100-slurm", "h100-slurm"]), "kubernetes.slurm.pools[1]"),
    (lambda d: d["kubernetes"]["slurm"].update(namespace="team-a"), "tenants[0].name"),  # clashes with a tenant's
    (lambda d: d["node_pools"][1].update(threads_per_core="two"), "node_pools[1].threads_per_core"),
])
def test_a_bad_slurm_section_is_refused_alike_by_validate_and_plan(project, edit, field):
    from tests.components.k8s.slurm_specs import with_slurm_pool
    data = yaml.safe_load((project / "stacks" / "dev.yaml").read_text())
    with_slurm_pool(data)
    edit(data)
    (project / "stacks" / "dev.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    messages = [refused(gpucluster(command, "dev", cwd=project)) for command in ("validate", "plan")]
    for message in messages:
        assert "stacks/dev.yaml:" in message and f" {field}: " in message, message
    assert messages[0].splitlines()[-1] == messages[1].splitlines()[-1]


@pytest.mark.parametrize("shards, field, says", [
    ([{"name": "platform", "node_pools": ["h100b"]}], "shards[0].name", "is the part that builds everything"),
    ([{"name": "b", "node_pools": ["h100c"]}], "shards[0].node_pools[0]", "no node pool named 'h100c'"),
    ([{"name": "b", "node_pools": ["h100b"]}, {"name": "c", "node_pools": ["h100b"]}], "shards[1].node_pools[0]",
     "already in shard 'b'"),
    ([{"name": "b", "node_pools": ["h100b"]}, {"name": "b", "node_pools": ["h100"]}], "shards[1].name",
     "'b' is already used"),
    ([{"name": "Rack A", "node_pools": ["h100b"]}], "shards[0].name", "'Rack A' is not a DNS label"),
    ("h100b", "shards", "expected a list"),
])
def test_a_bad_shard_is_refused_alike_by_validate_and_plan_naming_the_field(project, shards, field, says):
    from tests.components.test_split import split_staging
    shutil.copy(ROOT / "Pulumi.staging.yaml", project / "Pulumi.staging.yaml")
    data = split_staging()
    data["shards"] = shards
    (project / "stacks" / "staging.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    messages = [refused(gpucluster(command, "staging", cwd=project)) for command in ("validate", "plan")]
    for message in messages:
        assert "stacks/staging.yaml:" in message and f" {field}: " in message and says in message, message
    assert not (project / "build" / "staging").exists()          # nothing planned, nothing half-written
