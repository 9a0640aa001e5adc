"""A pool's shared script parts (ssh.Lib): shipped once, run from their file exactly as they would run inline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from components.bash import SHARED_BEGIN, script
from components.offline.plan import build_plan
from components.spec import load_spec
from components.ssh import LIB_DIR, Lib, as_command, expand, shared_parts, stored, unwrap
from tests.conftest import ssh_key

BODY = 'note "body of $HOST"\nchanged "something"\n'


def _run(text: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", text], cwd=cwd, capture_output=True, text=True, timeout=30)


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)             # where the program runs: the parts are written there
    return tmp_path


def test_a_shared_part_run_from_its_file_does_what_it_does_inline(workdir):
    text = script("Try gpu-1", "gpu-1", BODY, shared=True)
    lib = Lib([], [text])
    lib.write()
    factored = lib.factor(text, None)
    assert "body of" not in factored and SHARED_BEGIN not in factored
    inline, shipped = _run(text, workdir), _run(factored, workdir)
    assert shipped.returncode == inline.returncode == 0, shipped.stderr
    assert shipped.stdout == inline.stdout == "gpu-1: body of gpu-1\ngpu-1: changed: something\ngpu-1: 1 change(s)\n"


def test_a_remote_part_runs_only_when_its_file_is_the_one_shipped(workdir):
    """On the host the part is the SSH user's file: checked against its SHA-256 before root sources it."""
    text = script("Try gpu-1", "gpu-1", BODY, shared=True)
    lib = Lib([text])
    lib.write()
    factored = lib.factor(text, "ubuntu")
    sha = next(iter(lib.remote))
    assert f"GPUCLUSTER_SHARED=~ubuntu/{LIB_DIR}/{sha}.sh\n" in factored
    shipped = workdir / "home" / LIB_DIR
    shipped.mkdir(parents=True)
    here = factored.replace("~ubuntu/", f"{workdir / 'home'}/")       # the user's home, as the copy left it
    missing = _run(here, workdir)
    assert missing.returncode == 1 and "is missing or not the part this apply shipped" in missing.stderr
    assert missing.stderr.startswith("gpu-1: error: ") and not missing.stdout
    (shipped / f"{sha}.sh").write_text(lib.remote[sha].replace("body of", "tampered"))
    assert _run(here, workdir).returncode == 1
    for name in (lib.source / f"{sha}.sh", LIB_DIR / f"{sha}.sh"):         # the copy's folder and the program's
        assert name.read_text() == lib.remote[sha]
    (shipped / f"{sha}.sh").write_text(lib.remote[sha])
    ran = _run(here, workdir)
    assert ran.returncode == 0 and ran.stdout == _run(text, workdir).stdout


def test_a_remote_delete_runs_from_the_part_its_host_was_sent_or_undoes_nothing(workdir):
    """A delete runs long after its create shipped its part (the host keeps every part it was sent). Where the
    part is gone (a host reinstalled, a home wiped), it fails before it changes anything, saying so."""
    text = script("Undo gpu-1", "gpu-1", BODY, shared=True)
    lib = Lib([text])
    lib.write()
    factored = lib.factor(text, "ubuntu", undo=True)
    assert "body of" not in factored
    here = factored.replace("~ubuntu/", f"{workdir / 'home'}/")
    missing = _run(here, workdir)
    assert missing.returncode == 1 and not missing.stdout, missing
    assert "is missing or not the part this host was sent: nothing was undone" in missing.stderr
    assert "pulumi state delete" in missing.stderr
    sha = next(iter(lib.remote))
    (workdir / "home" / LIB_DIR).mkdir(parents=True)
    (workdir / "home" / LIB_DIR / f"{sha}.sh").write_text(lib.remote[sha])
    ran = _run(here, workdir)
    assert ran.returncode == 0 and ran.stdout == _run(text, workdir).stdout
    assert unwrap(as_command(factored, "ubuntu")) == text
    with pytest.raises(AssertionError):
        lib.factor(text, None, undo=True)           # a local delete keeps its whole text


def test_the_plan_shows_the_whole_script_again(workdir):
    text = script("Try gpu-1", "gpu-1", BODY, shared=True)
    lib = Lib([text])
    lib.write()
    for user in ("root", "ubuntu"):
        assert unwrap(as_command(lib.factor(text, user), user)) == text
    assert expand(lib.factor(text, None)) == text


def test_a_part_the_pool_does_not_share_stays_inline(workdir):
    """A host whose part differs (a subnet manager's fabric settings) runs it inline: nothing is looked up by
    a hash no file has."""
    ours, other = script("a", "gpu-1", BODY, shared=True), script("b", "gpu-2", "note other\n", shared=True)
    lib = Lib([ours])
    assert lib.factor(other, "root") == other
    assert lib.factor(script("c", "gpu-3", BODY), "root") == script("c", "gpu-3", BODY)     # unmarked: inline


def test_nested_marks_belong_to_the_outer_part():
    inner = script("inner", "h", BODY, shared=True)
    outer = script("outer", "h", f"cat <<'EOF'\n{inner}EOF\n", shared=True)
    (start, end, part), = shared_parts(outer)
    assert inner in part and outer[start:end].endswith("shared part ends\n")


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_every_gpu_host_runs_its_pools_shared_parts_from_the_copy(stack, record, workdir):
    """What keeps a GPU host's state small: each shared part of the scripts it runs over SSH (preparation and
    its undoing, membership, roll, burn-in, filesystem client) is a file the pool ships, so no command holds
    one inline, except a subnet manager's own fabric settings; and no host's commands and copy hold more than
    the budget of inputs (issue 55: 230 KB before, 53 KB with whole deletes and filesystem client; the kubectl
    deletes where pulumi runs stay whole, and the first client carries the shared directories' script)."""
    from components.cluster import GpuCluster
    spec = load_spec(Path(__file__).resolve().parents[2] / f"stacks/{stack}.yaml")
    run = record(lambda: GpuCluster(stack, spec, ssh_key()))
    sms = set(spec.fabric.infiniband.subnet_managers) if spec.fabric.infiniband else set()
    sizes: dict[str, int] = {}
    for r in build_plan(run).document["resources"]:
        name = r["urn"].rsplit("::", 1)[1]
        host = next((h.hostname for p in spec.node_pools for h in p.hosts
                     if name.startswith(f"{stack}-{p.name}-{h.hostname}-") or name == f"{stack}-storage-{h.hostname}"),
                    None)
        if host is None or not r["type"].startswith("command:"):
            continue
        sizes[host] = sizes.get(host, 0) + len(json.dumps(r["inputs"]))
        if host not in sms:
            for script in ("create", "delete"):
                assert SHARED_BEGIN not in json.dumps(r["inputs"].get(script, "")), (r["urn"], script)
    first_client = spec.node_pools[0].hosts[0].hostname
    assert sizes and max(n for h, n in sizes.items() if h not in sms | {first_client}) < 32_000, sizes
    assert max(sizes.values()) < 50_000, sizes          # a subnet manager's fabric settings are its own


def test_what_the_hosts_run_passes_shellcheck(record, workdir, tmp_path_factory):
    """The commands as stored (each shared part a line that runs its file) are scripts of their own."""
    from components.cluster import GpuCluster
    spec = load_spec(Path(__file__).resolve().parents[2] / "stacks/dev.yaml")
    out = tmp_path_factory.mktemp("stored")
    for r in build_plan(record(lambda: GpuCluster("dev", spec, ssh_key()))).document["resources"]:
        for script in ("create", "delete"):
            text = r["inputs"].get(script)
            if r["type"].startswith("command:") and isinstance(text, str) and "gpucluster: shared part" in text:
                (out / f"{r['urn'].rsplit('::', 1)[1]}.{script}.sh").write_text(stored(text))
    files = sorted(out.iterdir())
    # each host's prepare, burn-in, roll, leave, drain, uncordon and filesystem client; prepare's, leave's and
    # the client's deletes
    assert len(files) >= 2 * 10, files
    done = subprocess.run(["shellcheck", "-S", "warning", "-s", "bash", *map(str, files)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout
