"""What the BeeGFS scripts write, checked against what BeeGFS's daemons accept (keys from its own parsers)."""

from __future__ import annotations

import itertools
import re
import tomllib

import pytest
import yaml

from components.spec import parse_spec
from components.storage import plan_layout
from components.storage.scripts import render_beegfs_client, render_beegfs_server
from tests.components.storage.beegfs_upstream import CONF_KEYS, MGMTD8_TOML_KEYS
from tests.conftest import _DEV, problems_of

_SET_CONF = re.compile(r"^set_conf /etc/beegfs/beegfs-(\w+)\.conf (\w+) ?(.*?) restart-beegfs-\1$", re.M)


def beegfs(version: str, quotas: bool, auth: bool = True, fabric: str | None = None) -> dict:
    data = yaml.safe_load(yaml.safe_dump(_DEV))
    data["storage"].update(version=version, quotas=quotas, auth=auth)
    if version == "8" and quotas:
        data["storage"]["license_file"] = "/etc/beegfs/license.pem"
    if fabric == "ethernet":
        data["fabric"] = {"kind": "ethernet"}
        for pool in data["node_pools"]:
            pool.pop("nics", None)
        data["kubernetes"].pop("network_operator", None)
        data["storage"]["client_interface"] = "eth0"
    return data


def written(spec) -> dict[str, dict[str, str]]:
    """Every conf key a host's scripts set, by daemon: {role: {key: value}}."""
    layout = plan_layout(spec)
    texts = [render_beegfs_server(spec, layout, s.hostname).create for s in layout.servers]
    texts += [render_beegfs_client(spec, layout, h.hostname, "eth0").create for _, h in spec.hosts()]
    out: dict[str, dict[str, str]] = {}
    for text in texts:
        for role, key, value in _SET_CONF.findall(text):
            out.setdefault(role, {})[key] = value.strip("'")
    return out


# BeeGFS 8 refuses to run without auth (and the spec refuses it), so it is not a case.
CASES = [c for c in itertools.product(("7.4", "8"), (True, False), (True, False)) if c[0] == "7.4" or c[2]]


@pytest.mark.parametrize(("version", "quotas", "auth"), CASES)
def test_every_key_written_is_one_its_daemon_accepts(version, quotas, auth):
    confs = written(parse_spec(yaml.safe_dump(beegfs(version, quotas, auth))))
    assert set(confs) == ({"meta", "storage", "client"} | ({"mgmtd", "helperd"} if version == "7.4" else set()))
    for role, settings in confs.items():
        rejected = set(settings) - CONF_KEYS[(version, role)]
        assert not rejected, f"beegfs-{role} {version} exits at start on {sorted(rejected)}"


@pytest.mark.parametrize("version", ["7.4", "8"])
def test_quotas_turn_on_enforcement_on_every_server_and_the_client(version):
    confs = written(parse_spec(yaml.safe_dump(beegfs(version, quotas=True))))
    for role in ("meta", "storage") + (("mgmtd",) if version == "7.4" else ()):
        assert confs[role]["quotaEnableEnforcement"] == "true", role
        assert "quotaEnabled" not in confs[role]
    assert confs["client"]["quotaEnabled"] == "true"
    off = written(parse_spec(yaml.safe_dump(beegfs(version, quotas=False))))
    assert off["storage"]["quotaEnableEnforcement"] == "false" and off["client"]["quotaEnabled"] == "false"


def test_beegfs_8_mgmtd_takes_only_its_own_toml_keys_and_the_licence():
    spec = parse_spec(yaml.safe_dump(beegfs("8", quotas=True)))
    server = render_beegfs_server(spec, plan_layout(spec), "stor-dev-01").create
    toml_text = re.search(r"put_file /etc/beegfs/beegfs-mgmtd.toml 0644 \"\$\(cat <<'GPUCLUSTER_EOF'\n(.*?)\n"
                          r"GPUCLUSTER_EOF", server, re.S).group(1)
    settings = tomllib.loads(toml_text)            # real TOML, as mgmtd parses it
    assert set(settings) <= MGMTD8_TOML_KEYS
    assert settings["quota-enable"] is True and settings["quota-enforce"] is True
    assert settings["license-cert-file"] == "/etc/beegfs/license.pem"
    assert "[[ -f /etc/beegfs/license.pem ]] || fail" in server.split("# --- packages")[0]   # before any change


def test_beegfs_8_quotas_need_a_licence_and_beegfs_quotas_are_off_by_default():
    data = beegfs("8", quotas=True)
    del data["storage"]["license_file"]
    assert any("storage.quotas: BeeGFS 8 enforces quotas only with a licence" in p for p in problems_of(data))
    default = yaml.safe_load(yaml.safe_dump(_DEV))
    default["storage"]["version"] = "8"
    assert not problems_of(default)
    assert not parse_spec(yaml.safe_dump(default)).storage.effective_quotas
    lustre_licence = beegfs("7.4", quotas=True)
    lustre_licence["storage"]["license_file"] = "/etc/beegfs/license.pem"
    assert any("storage.license_file: license_file is BeeGFS 8's" in p for p in problems_of(lustre_licence))


def test_beegfs_7_quotas_are_warned_as_an_enterprise_feature():
    spec = parse_spec(yaml.safe_dump(beegfs("7.4", quotas=True)))
    assert any("BeeGFS 7.4 quota enforcement is an enterprise feature" in w for w in spec.warnings())
    unlimited = parse_spec(yaml.safe_dump(beegfs("7.4", quotas=False)))
    assert any("storage quotas are off, so the filesystem_gib of tenant(s)" in w for w in unlimited.warnings())


def test_rdma_fabrics_use_rdma_and_need_the_rdma_library_on_servers():
    spec = parse_spec(yaml.safe_dump(beegfs("7.4", quotas=False)))
    assert spec.fabric.rdma
    confs = written(spec)
    assert confs["meta"]["connUseRDMA"] == confs["storage"]["connUseRDMA"] == confs["client"]["connUseRDMA"] \
        == "true"
    layout = plan_layout(spec)
    server = render_beegfs_server(spec, layout, "stor-dev-01").create
    assert "require path /opt/beegfs/lib/libbeegfs_ib.so libbeegfs-ib libbeegfs-ib" in server
    client = render_beegfs_client(spec, layout, "gpu-dev-01", "eth0").create
    assert "OFED_INCLUDE_PATH=/usr/src/ofa_kernel/default/include" in client
    tcp = parse_spec(yaml.safe_dump(beegfs("7.4", quotas=False, fabric="ethernet")))
    assert written(tcp)["client"]["connUseRDMA"] == "false"
    assert "libbeegfs_ib" not in render_beegfs_server(tcp, plan_layout(tcp), "stor-dev-01").create


def test_quota_tracking_mounts_storage_targets_with_xfs_accounting():
    spec = parse_spec(yaml.safe_dump(beegfs("7.4", quotas=True)))
    server = render_beegfs_server(spec, plan_layout(spec), "stor-dev-01").create
    assert "xfs defaults,noatime,nofail,uqnoenforce,gqnoenforce" in server
    assert "ext4 defaults,noatime,nofail\n" in server          # metadata targets need no accounting



def _rdma_check(tmp_path, config: str, nodes: str):
    """The client script's RDMA check, run by bash against a proc tree in the module's format (ProcFsHelper.c)."""
    import subprocess

    from components.spec import load_spec
    from components.storage.layout import plan_layout
    from components.storage.scripts import BEEGFS_PROC, render_beegfs_client
    from tests.conftest import ROOT
    spec = load_spec(ROOT / "stacks" / "dev.yaml")                       # BeeGFS over RDMA on RoCE
    layout = plan_layout(spec)
    text = render_beegfs_client(spec, layout, "gpu-dev-01", "ens1f0np0").create
    start = text.index("beegfs_rdma() {")
    function = text[start:text.index("\n}\n", start) + 3]
    assert f"beegfs_rdma {BEEGFS_PROC} {layout.mount_point}\n" in text
    proc = tmp_path / "proc" / "beegfs" / "1A2B-3C4D-gpu-dev-01"
    proc.mkdir(parents=True)
    (proc / "config").write_text(f"cfgFile = /etc/beegfs/beegfs-client.conf\nconnUseRDMA = {config}\n")
    (proc / "meta_nodes").write_text("stor-dev-01 [ID: 1]\n   Root: <yes>\n   Connections: RDMA: 1 (10.22.0.31:8005); \n")
    (proc / "storage_nodes").write_text(nodes)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "df").chmod(0o755)
    harness = ('fail() { echo "$*" >&2; exit 1; }\nnote() { echo "$*"; }\n' + function
               + f"beegfs_rdma {tmp_path / 'proc' / 'beegfs'} /mnt/devfs\n")
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + harness], capture_output=True, text=True,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=30)


def test_an_rdma_client_passes_when_every_server_is_reached_over_rdma(tmp_path):
    out = _rdma_check(tmp_path, "1", "stor-dev-01 [ID: 1]\n   Connections: TCP: 1 (10.22.0.31:8003); RDMA: 4 "
                                     "(10.22.0.31:8003); \nstor-dev-02 [ID: 2]\n   Connections: <none>\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout == "BeeGFS over RDMA to every server it is connected to\n"


def test_a_client_module_without_rdma_or_a_server_over_tcp_fails_saying_which(tmp_path):
    out = _rdma_check(tmp_path, "0", "")
    assert out.returncode == 1 and "the BeeGFS client module runs without RDMA" in out.stderr
    out = _rdma_check(tmp_path / "b", "1", "stor-dev-01 [ID: 1]\n   Connections: TCP: 2 (10.22.0.31:8003); \n")
    assert out.returncode == 1
    assert out.stderr.startswith("the BeeGFS client reaches stor-dev-01 over TCP, not RDMA: install libbeegfs-ib")
