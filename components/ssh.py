"""Push generated scripts to hosts and switches as `pulumi_command.remote.Command` resources.

One way for every SSH-pushed part of the project (node pools, fabric, storage):
- the connection comes from the spec; the private key is a Pulumi secret and pulumi-command keeps the whole
  connection secret; `host_key` is pinned when the spec has one; a bastion is a single-hop `proxy`;
- the script travels inside the command as a quoted heredoc run by bash (as root through `sudo -n` for other
  users), never through `environment` (sshd refuses variables it does not AcceptEnv); a secret the script
  needs comes on the session's standard input (`stdin`, secret), so the script itself stays plain text that a
  plan shows and a review reads;
- by default `triggers` holds the script's hash, so a changed script replaces the command, and a replacement
  deletes before it creates: the old `delete` undoes the old state first, instead of undoing the new one after
  it is applied;
- a `converge` script brings a host from any earlier state of its own to the new one (host preparation): a
  change runs it again as the command's `update`, and its `delete` runs only when the resource is destroyed,
  never between two versions (which would tear down, say, kubelet settings it is about to rewrite).
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple, Sequence

import pulumi
from pulumi_command import remote

from .bash import by_bash, in_sequence
from .spec.hardware import Bastion

SCRIPT_MARKER = "GPUCLUSTER_SCRIPT"
_WRAPPED = re.compile(rf"^(?:sudo -n )?/bin/bash (?:-s <<'({SCRIPT_MARKER}[0-9]*)'\n(.*)\n\1|"
                      rf"-c \"\$\(cat <<'({SCRIPT_MARKER}[0-9]*)'\n(.*)\n\3\n\)\" gpucluster)\n?$", re.S)
# One argument of a command line holds at most 128 KiB (Linux MAX_ARG_STRLEN): a script run with `bash -c`.
MAX_ARG_BYTES = 128 * 1024


class SshTarget(NamedTuple):
    host: str
    user: str
    port: int = 22
    host_key: str | None = None
    bastion: Bastion | None = None


class Script(NamedTuple):
    create: str | pulumi.Output[str]    # an Output only where the script embeds a secret
    delete: str | None = None


def digest(script: Script) -> str:
    return hashlib.sha256(f"{script.create}\0{script.delete or ''}".encode()).hexdigest()


def as_command(text: str, user: str, stdin: bool = False) -> str:
    """What the SSH session runs: the script fed to bash, with root rights. `stdin`: the script reads the
    session's standard input, so bash takes the script as its argument instead of on its input."""
    size = len(text.encode())
    if stdin and size > MAX_ARG_BYTES - 1024:
        raise ValueError(f"a script that reads standard input is at most {MAX_ARG_BYTES - 1024} bytes "
                         f"(one argument of a command line); this one has {size}")
    return f"{'' if user == 'root' else 'sudo -n '}{by_bash(text, SCRIPT_MARKER, stdin)}\n"


def unwrap(command: str) -> str:
    """The script inside a command built by `as_command` (the plan shows scripts, not wrappers)."""
    m = _WRAPPED.match(command)
    return (m.group(2) if m.group(2) is not None else m.group(4)) + "\n" if m else command


def connection(target: SshTarget, private_key: pulumi.Input[str]) -> remote.ConnectionArgs:
    proxy = None
    if target.bastion is not None:
        b = target.bastion
        proxy = remote.ProxyConnectionArgs(host=b.host, port=b.port, user=b.user, private_key=private_key,
                                           host_key=b.host_key)
    return remote.ConnectionArgs(host=target.host, port=target.port, user=target.user, private_key=private_key,
                                 host_key=target.host_key, proxy=proxy, dial_error_limit=10, per_dial_timeout=15)


def push(name: str, target: SshTarget, script: Script, private_key: pulumi.Input[str], *,
         parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = (), converge: bool = False,
         protect: bool = False, stdin: pulumi.Input[str] | None = None, then: str | None = None,
         replace_on: str | None = None) -> remote.Command:
    """One remote command for a script. A create script built from a secret comes as an Output and stays
    secret. `protect`: the engine refuses to delete the command (a server that holds data) until it is lifted.
    `stdin`: a secret the script reads from its standard input (it stays out of the script and the plan).
    `then`: a script run after `script` in the same session, and alone as the command's update: a change to it
    updates the command in place, a change to `script` replaces it. Omitted: none.
    `replace_on`: what the command's host *is* (a storage server's targets: devices and indexes); only a change
    to it replaces the command, and any other change to the script, which converges, runs it again in place
    (a setting that applies live never unmounts a target). Omitted: any change to the script replaces it."""
    piped = stdin is not None
    create: pulumi.Input[str]
    update: pulumi.Input[str] | None = None
    trigger: pulumi.Input[str]
    if then is not None:
        assert isinstance(script.create, str) and not converge, "`then` follows a plain, replaced script"
        create = as_command(in_sequence(name, [script.create, then], stdin=piped), target.user, piped)
        update, trigger = as_command(then, target.user), digest(script)
    elif isinstance(script.create, pulumi.Output):
        create = script.create.apply(lambda text: as_command(text, target.user, piped))
        trigger = script.create.apply(lambda text: digest(Script(text, script.delete)))
    else:
        create, trigger = as_command(script.create, target.user, piped), digest(script)
    if replace_on is not None:
        assert then is None and not converge, "`replace_on` is its own way of updating"
        update, trigger = create, hashlib.sha256(replace_on.encode()).hexdigest()
    return remote.Command(
        name, connection=connection(target, private_key), create=create,
        update=create if converge else update,
        delete=as_command(script.delete, target.user) if script.delete else None,
        # The SDK marks triggers replace-on-change: a converging script must not have any.
        triggers=None if converge else [trigger],
        add_previous_output_in_env=False, stdin=None if stdin is None else pulumi.Output.secret(stdin),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on), protect=protect,
                                    delete_before_replace=script.delete is not None))
