"""Breaking spec changes: each is in the CHANGELOG under its release, matches the current models, and an error
about its field names the release and the migration."""

from __future__ import annotations

import re

import pytest

from components.spec.changes import SPEC_CHANGES, pattern
from components.spec.loader import _model_at
from components.spec import ClusterSpec
from tests.conftest import ROOT, problems_of


def _releases() -> dict[str, str]:
    text = (ROOT / "CHANGELOG.md").read_text()
    parts = re.split(r"^## (\S+).*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("change", SPEC_CHANGES, ids=lambda c: c.field)
def test_every_spec_change_is_told_in_the_changelog_under_its_release(change):
    section = _releases().get(change.release)
    assert section is not None, f"CHANGELOG.md has no section for release {change.release}"
    assert change.field.rsplit(".", 1)[-1] in section, f"{change.field} is not mentioned under {change.release}"


def _loc(field: str) -> tuple:
    return tuple(0 if part == "[]" else part for part in re.findall(r"\[\]|[^.\[\]]+", field))


@pytest.mark.parametrize("change", SPEC_CHANGES, ids=lambda c: c.field)
def test_every_spec_change_matches_the_current_models(change):
    loc = _loc(change.field)
    assert pattern(loc) == change.field
    owner = _model_at(loc[:-1], ClusterSpec)
    assert owner is not None, f"{change.field}: no model owns it"
    field = owner.model_fields.get(loc[-1])
    if change.kind == "required":
        assert field is not None and field.is_required(), f"{change.field} is not a required field now"
    else:
        assert field is None, f"{change.field} still exists"


def test_the_newest_release_is_the_package_version():
    newest = next(iter(_releases()))
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert version.startswith(newest), (newest, version)


def test_a_spec_for_an_earlier_release_is_told_what_changed(dev_data):
    dev_data["node_pools"][0]["tuning"]["kubelet_topology_single_numa"] = True
    storage = dev_data["storage"]
    storage["package_repository"] = {"url": "https://mirror.example/beegfs"}
    del storage["servers"][0]["targets"][0]["raid_level"]
    found = [p.split(": ", 1)[1] for p in problems_of(dev_data)]
    assert "node_pools[0].tuning.kubelet_topology_single_numa: unknown field 'kubelet_topology_single_numa': " \
           "renamed in release 0.1.0 (CHANGELOG.md): it is now kubelet_topology_policy" in "\n".join(found)
    assert any(m.startswith("storage.package_repository: unknown field 'package_repository': renamed in release "
                            "0.2.0 (CHANGELOG.md): it is now storage.package_repositories") for m in found), found
    assert "storage.servers[0].targets[0].raid_level: required field is missing; required since release 0.2.0 " \
           "(CHANGELOG.md): give the device's redundancy" in "\n".join(found)
