"""The command provider's stand-in for the real engine: pulumi-command's `command:remote:Command` and
`command:local:Command`, which really run their commands.

The module proxy refuses every version of github.com/pulumi/pulumi-command/provider, so this gRPC provider takes
its place in the engine tests, and nothing else does. It follows pulumi-command 1.2's documented contract (and
its v1.2.1 source, where the documentation is silent):
- Create runs `create`; Update runs `update`, or `create` where there is none; Delete runs `delete`. A step with no
  command to run changes nothing. A non-zero exit fails the step with the command's output.
- A change to `triggers` replaces the resource (create of the new one, then delete of the old, as the engine
  orders a replacement that is not delete-before-replace); any other change to an input updates it in place.
- With `addPreviousOutputInEnv` (default true), update and delete see the last run's output as
  PULUMI_COMMAND_STDOUT and PULUMI_COMMAND_STDERR.
- Outputs are the inputs plus `stdout` and `stderr` (a trailing newline trimmed); secrets among the inputs stay
  secret in the outputs.
- Local: `interpreter` (default /bin/sh -c) in `dir` (default the provider's directory), `environment` added to
  the provider's own, `stdin` on standard input.
- Remote: OpenSSH to `connection` (host, port 22, user root, privateKey; `hostKey` pinned when given, else any
  key is accepted; `proxy` as a single jump), the command run by the login shell, `stdin` on standard input.
  pulumi-command sets `environment` through the SSH session, which a server passes on only where its AcceptEnv
  allows: this stand-in sends it with SendEnv, so the same holds.
- `command:remote:CopyToRemote`: `source` (a file or a folder: the asset or archive's path, relative to the
  project) copied over SSH to `remotePath` (relative paths from the user's home; a folder lands in it as
  remotePath/<folder>, a file at remotePath, parent folders made); copied again on an update only when the
  source's hash or remotePath changed; nothing removed on delete. OpenSSH's tar stream stands in for SFTP.
Every command here has a time bound (COMMAND_TIMEOUT_S), so a hung command fails the step instead of the test run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import provider_pb2

from .engine import Plugin

SECRET_KEY, SECRET_SIG = "4dabf18193072939515e22adb298388d", "1b47061264138c4ac30d75fd1eb44270"
COMMAND_TIMEOUT_S = 900
REMOTE = "command:remote:Command"
COPY = "command:remote:CopyToRemote"


def plain(value: Any) -> Any:
    """A property value with its secret wrappers taken off (what the command sees)."""
    if isinstance(value, dict):
        if value.get(SECRET_KEY) == SECRET_SIG:
            return plain(value.get("value"))
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def _props(message: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(message)


class CommandProvider(Plugin):
    def __init__(self, version: str, workdir: Path):
        super().__init__(version)
        self.workdir = workdir
        self.runs: list[tuple[str, str]] = []          # (operation, resource name), in the order they ran

    def Diff(self, request, context):
        olds, news = plain(_props(request.old_inputs)), plain(_props(request.news))
        changed = sorted(k for k in olds.keys() | news.keys() if olds.get(k) != news.get(k))
        replaces = [k for k in changed if k == "triggers"]
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME if changed else provider_pb2.DiffResponse.DIFF_NONE,
            diffs=changed, replaces=replaces)

    def Create(self, request, context):
        inputs = _props(request.properties)
        if request.preview:
            return provider_pb2.CreateResponse(id="", properties=request.properties)
        if request.urn.split("::")[2].endswith(COPY):
            self._copy(context, "create", request.urn, plain(inputs))
            return provider_pb2.CreateResponse(id=_id(request.urn), properties=request.properties)
        out = self._run(context, "create", request.urn, inputs, inputs.get("create"), {})
        return provider_pb2.CreateResponse(id=_id(request.urn), properties=_outputs(request.properties, out))

    def Update(self, request, context):
        news, olds = _props(request.news), plain(_props(request.olds))
        if request.preview:
            return provider_pb2.UpdateResponse(properties=request.news)
        if request.urn.split("::")[2].endswith(COPY):
            new = plain(news)
            if (new["source"].get("hash"), new["remotePath"]) != (olds["source"].get("hash"), olds["remotePath"]):
                self._copy(context, "update", request.urn, new)
            return provider_pb2.UpdateResponse(properties=request.news)
        command = news.get("update") or news.get("create")
        out = self._run(context, "update", request.urn, news, command, _previous(news, olds))
        if command is None:              # nothing ran: the last run's output stands
            out = (olds.get("stdout", ""), olds.get("stderr", ""))
        return provider_pb2.UpdateResponse(properties=_outputs(request.news, out))

    def Delete(self, request, context):
        olds = _props(request.properties)
        self._run(context, "delete", request.urn, olds, olds.get("delete"), _previous(plain(olds), plain(olds)))
        return empty_pb2.Empty()

    def Read(self, request, context):
        return provider_pb2.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)

    def _run(self, context, op: str, urn: str, inputs: dict[str, Any], command: Any,
             previous: dict[str, str]) -> tuple[str, str]:
        if command is None:
            return "", ""
        name = urn.rsplit("::", 1)[-1]
        self.runs.append((op, name))
        args = plain(inputs)
        try:
            if urn.split("::")[2].endswith(REMOTE):
                done = self._remote(args, plain(command), previous)
            else:
                done = self._local(args, plain(command), previous)
        except subprocess.TimeoutExpired:
            context.abort(grpc.StatusCode.UNKNOWN, f"{op} of {name}: no result within {COMMAND_TIMEOUT_S} s")
        if done.returncode != 0:
            context.abort(grpc.StatusCode.UNKNOWN, f"{op} of {name}: process exited with status "
                          f"{done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr}")
        return done.stdout.removesuffix("\n"), done.stderr.removesuffix("\n")

    def _copy(self, context, op: str, urn: str, args: dict[str, Any]) -> None:
        name = urn.rsplit("::", 1)[-1]
        self.runs.append((op, name))
        source = Path(self.workdir, args["source"]["path"])
        dest = args["remotePath"]
        if source.is_dir():     # the folder lands in dest, as dest/<folder>
            unpack, stream = f"mkdir -p {shlex.quote(dest)} && tar -C {shlex.quote(dest)} -xf -", \
                subprocess.run(["tar", "-C", str(source.parent), "-cf", "-", source.name], capture_output=True,
                               check=True).stdout
        else:
            unpack = f"mkdir -p \"$(dirname {shlex.quote(dest)})\" && cat > {shlex.quote(dest)}"
            stream = source.read_bytes()
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            try:
                done = subprocess.run([*_session(Path(tmp), args["connection"], {}), unpack], input=stream,
                                      capture_output=True, timeout=COMMAND_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                context.abort(grpc.StatusCode.UNKNOWN, f"{op} of {name}: no copy within {COMMAND_TIMEOUT_S} s")
        if done.returncode != 0:
            context.abort(grpc.StatusCode.UNKNOWN, f"{op} of {name}: the copy exited with status {done.returncode}\n"
                          f"{done.stderr.decode(errors='replace')}")

    def _local(self, args: dict[str, Any], command: str, previous: dict[str, str]) -> subprocess.CompletedProcess:
        interpreter = args.get("interpreter") or ["/bin/sh", "-c"]
        env = {**os.environ, **(args.get("environment") or {}), **previous}
        return subprocess.run([*interpreter, command], cwd=args.get("dir") or self.workdir, env=env,
                              input=args.get("stdin"), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)

    def _remote(self, args: dict[str, Any], command: str, previous: dict[str, str]) -> subprocess.CompletedProcess:
        env = {**(args.get("environment") or {}), **previous}
        with tempfile.TemporaryDirectory(dir=self.workdir) as tmp:
            return subprocess.run([*_session(Path(tmp), args["connection"], env), command],
                                  env={**os.environ, **env}, input=args.get("stdin") or "", capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S)


def _session(tmp: Path, conn: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The ssh command line to the connection's host (through its proxy, if any), sending `env`'s names."""
    ssh = _ssh(tmp, conn, "target")
    if conn.get("proxy"):
        jump = _ssh(tmp, conn["proxy"], "proxy")
        ssh += ["-o", "ProxyCommand=" + shlex.join([*jump, "-W", "%h:%p"])]
    return [*ssh, *(o for k in env for o in ("-o", f"SendEnv={k}")), f"{conn.get('user') or 'root'}@{conn['host']}"]


def _ssh(tmp: Path, conn: dict[str, Any], role: str) -> list[str]:
    key = tmp / f"{role}.key"
    # Go's SSH library reads a key without its final newline, which `pulumi config set` strips; OpenSSH needs it.
    key.write_text(conn["privateKey"].rstrip("\n") + "\n")
    key.chmod(0o600)
    port = int(conn.get("port") or 22)
    opts = ["-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={int(conn.get('perDialTimeout') or 15)}",
            "-o", f"ConnectionAttempts={int(conn.get('dialErrorLimit') or 10)}"]
    if conn.get("hostKey"):
        known = tmp / f"{role}.known_hosts"
        where = conn["host"] if port == 22 else f"[{conn['host']}]:{port}"
        known.write_text(f"{where} {conn['hostKey']}\n")
        opts += ["-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes"]
    else:
        opts += ["-o", "UserKnownHostsFile=/dev/null", "-o", "StrictHostKeyChecking=no"]
    return ["ssh", "-i", str(key), "-p", str(port), *opts]


def _previous(inputs: dict[str, Any], olds: dict[str, Any]) -> dict[str, str]:
    if inputs.get("addPreviousOutputInEnv", True) is False:
        return {}
    return {"PULUMI_COMMAND_STDOUT": str(olds.get("stdout", "")), "PULUMI_COMMAND_STDERR": str(olds.get("stderr", ""))}


def _outputs(inputs: struct_pb2.Struct, out: tuple[str, str]) -> struct_pb2.Struct:
    props = struct_pb2.Struct()
    props.MergeFrom(inputs)
    props.update({"stdout": out[0], "stderr": out[1]})
    return props


def _id(urn: str) -> str:
    return urn.rsplit("::", 1)[-1]
