"""The pack itself, as `pulumi preview --policy-pack policies` starts it."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_the_pack_starts_its_analyzer_with_every_policy_and_serves():
    """`__main__.py` is only ever run, never imported: PolicyPack prints its port and serves until killed."""
    with pytest.raises(subprocess.TimeoutExpired) as ran:
        subprocess.run([sys.executable, "-u", "__main__.py"], cwd=ROOT / "policies", capture_output=True, timeout=8)
    assert (ran.value.stdout or b"").decode().strip().isdigit(), ran.value.stderr


def test_no_test_imports_the_packs_entry_point():
    for path in (ROOT / "tests").rglob("*.py"):
        if path.name == "test_pack.py":
            continue
        text = path.read_text()
        assert "policies.__main__" not in text and "from __main__" not in text, path


KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
SECRET_SIG = {"4dabf18193072939515e22adb298388d": "1b47061264138c4ac30d75fd1eb44270"}


@pytest.fixture
def analyzer():
    """The pack as the real engine starts it (policies/analyzer), answering Analyze over gRPC."""
    import grpc
    from pulumi.runtime.proto import analyzer_pb2_grpc

    proc = subprocess.Popen([str(ROOT / "policies" / "analyzer"), "127.0.0.1:1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={"PATH": "/usr/bin:/bin", "PULUMI_PYTHON_CMD": sys.executable})
    try:
        port = proc.stdout.readline().decode().strip()
        assert port.isdigit(), proc.stderr.read().decode()
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        proc.kill()
        proc.wait()


def _findings(analyzer, type_: str, props: dict) -> list[str]:
    from google.protobuf import struct_pb2
    from pulumi.runtime.proto import analyzer_pb2

    properties = struct_pb2.Struct()
    properties.update(props)
    response = analyzer.Analyze(analyzer_pb2.AnalyzeRequest(
        type=type_, properties=properties, name="x", urn=f"urn:pulumi:dev::gpucluster::{type_}::x"), timeout=30)
    return [d.policyName for d in response.diagnostics]


def test_under_the_engine_a_key_inside_a_secret_is_kept_and_one_in_the_clear_is_a_leak(analyzer):
    """The engine hands the analyzer secrets' values: a secret kubeconfig (the client's key inside) passed as a
    command's stdin is what every rollout command carries; the same key in the clear is a leak."""
    command = "command:local:Command"
    secret = {"create": "kubectl get nodes", "stdin": {**SECRET_SIG, "value": KEY}}
    assert "secrets-no-key-material" not in _findings(analyzer, command, secret)
    assert "secrets-no-key-material" in _findings(analyzer, command, {"create": "kubectl get nodes", "stdin": KEY})


@pytest.mark.parametrize("args, env, says", [
    ([], {"PULUMI_PYTHON_CMD": sys.executable}, "usage: policies/analyzer ENGINE_ADDRESS"),
    (["127.0.0.1:1"], {"PULUMI_PYTHON_CMD": "/bin/false"}, "/bin/false cannot import pulumi_policy; set PULUMI_PYTHON_CMD"),
])
def test_the_analyzer_launcher_started_wrongly_says_what_to_do(args, env, says):
    done = subprocess.run([str(ROOT / "policies" / "analyzer"), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode != 0 and says in done.stderr and not done.stdout, done.stderr
