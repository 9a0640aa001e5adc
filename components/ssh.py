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
  change runs it again as the command's update, and its `delete` runs only when the resource is destroyed,
  never between two versions (which would tear down, say, kubelet settings it is about to rewrite);
- the part of a script that is the same on every host of a pool (bash.SHARED_BEGIN) travels once per host and
  version, as a file a `-scripts` copy puts on the host (`Lib`), and each command that runs it holds a line
  that checks and runs that file instead: the engine stores each command's inputs twice at every checkpoint,
  and a pool's preparation, its undoing, roll, burn-in and filesystem client are the same text on all its
  hosts (issue 55);
- a command whose update runs its `create` again has no `update`: pulumi-command runs `create` where `update`
  is unset (remote and local, v1.2.1 commandController.go), and the engine stores every input twice (inputs
  and outputs), so a copy of the script would double the host's state for nothing.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Iterable, NamedTuple, Sequence

import pulumi
from pulumi_command import remote

from .bash import SHARED_BEGIN, SHARED_END, by_bash, in_sequence, unmarked
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


def stored(command: str) -> str:
    """The script inside a command built by `as_command`, as the host runs it."""
    m = _WRAPPED.match(command)
    return (m.group(2) if m.group(2) is not None else m.group(4)) + "\n" if m else command


def unwrap(command: str) -> str:
    """The whole script inside a command built by `as_command`, its shared parts in place (the plan shows
    scripts, not wrappers)."""
    return expand(stored(command))


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
         replace_on: str | None = None, lib: Lib | None = None) -> remote.Command:
    """One remote command for a script. A create script built from a secret comes as an Output and stays
    secret. `protect`: the engine refuses to delete the command (a server that holds data) until it is lifted.
    `stdin`: a secret the script reads from its standard input (it stays out of the script and the plan).
    `then`: a script run after `script` in the same session, and alone as the command's update: a change to it
    updates the command in place, a change to `script` replaces it. Omitted: none.
    `replace_on`: what the command's host *is* (a storage server's targets: devices and indexes); only a change
    to it replaces the command, and any other change to the script, which converges, runs it again in place
    (a setting that applies live never unmounts a target). Omitted: any change to the script replaces it.
    `lib`: the pool's shared parts, shipped to the host before this command runs (`ship`); its scripts, the
    delete too, run them from there (the trigger stays the whole script's digest, its marks aside). Omitted:
    all text inline."""
    piped = stdin is not None

    def command(text: str, stdin: bool = False) -> str:
        return as_command(lib.factor(text, target.user) if lib else text, target.user, stdin)

    def identity(s: Script) -> str:
        # With a lib, the marks say only what the copy carries: a script whose part starts to travel is the
        # same script, and is not replaced for it (a filesystem client, say, is not remounted).
        return digest(Script(unmarked(s.create), s.delete and unmarked(s.delete)) if lib else s)

    create: pulumi.Input[str]
    update: pulumi.Input[str] | None = None
    trigger: pulumi.Input[str]
    if then is not None:
        assert isinstance(script.create, str) and not converge, "`then` follows a plain, replaced script"
        create = command(in_sequence(name, [script.create, then], stdin=piped), piped)
        update, trigger = command(then), identity(script)
    elif isinstance(script.create, pulumi.Output):
        create = script.create.apply(lambda text: command(text, piped))
        trigger = script.create.apply(lambda text: identity(Script(text, script.delete)))
    else:
        create, trigger = command(script.create, piped), identity(script)
    if replace_on is not None:
        assert then is None and not converge, "`replace_on` is its own way of updating"
        trigger = hashlib.sha256(replace_on.encode()).hexdigest()       # an update runs `create` again
    return remote.Command(
        name, connection=connection(target, private_key), create=create,
        update=update,                  # None: an update runs `create` again
        delete=as_command(lib.factor(script.delete, target.user, undo=True) if lib else script.delete, target.user)
        if script.delete else None,
        # The SDK marks triggers replace-on-change: a converging script must not have any.
        triggers=None if converge else [trigger],
        add_previous_output_in_env=False, stdin=None if stdin is None else pulumi.Output.secret(stdin),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on), protect=protect,
                                    delete_before_replace=script.delete is not None))


# Where shared parts are written, relative to where the program runs (the engine, its providers and local
# commands run there too), and where a `-scripts` copy puts them, relative to the SSH user's home: each part a
# file named by its SHA-256, so a command names the same file whatever else its pool ships.
LIB_DIR = Path(".gpucluster") / "lib"
SHIP_DIR = Path(".gpucluster") / "ship"         # <set>/lib: one pool's remote parts, as one copy takes them
_LOADER = re.compile(r"^# gpucluster: shared part (?P<sha>[0-9a-f]{64})\n.*?\n\. \"\$GPUCLUSTER_SHARED\"\n",
                     re.S | re.M)
_MARKS = re.compile(rf"^(?:{re.escape(SHARED_BEGIN)}|{re.escape(SHARED_END)})\n", re.M)


def shared_parts(text: str) -> list[tuple[int, int, str]]:
    """(start, end, part) of each outermost shared part of `text`, its marks included in start..end."""
    out, depth, start = [], 0, 0
    for m in _MARKS.finditer(text):
        if m[0].startswith(SHARED_BEGIN):
            depth += 1
            if depth == 1:
                start = m.start()
        elif depth:
            depth -= 1
            if depth == 0:
                out.append((start, m.end(), text[start + len(SHARED_BEGIN) + 1:m.start()]))
    return out


def _parts(texts: Iterable[str]) -> dict[str, str]:
    return {hashlib.sha256(p.encode()).hexdigest(): p for t in texts for _, _, p in shared_parts(t)}


class Lib:
    """A pool's shared script parts, each written once as a file named by its SHA-256 where the program runs,
    and the remote ones put on each of its hosts by one `-scripts` copy: a command holds a line that checks and
    sources the file instead of the text. A file, once written or copied, is never removed, so a command an
    earlier version stored still finds its part. A remote delete runs its part from the host too, whenever
    it runs (see `factor`); a local delete keeps its whole text, since it may run from a checkout of a later
    version, on a machine that never wrote its part. `remote`: scripts run over SSH; `local`: scripts run
    where pulumi runs (their parts are not shipped, so a local part that follows the pool's size, as the
    drain's does, never touches the hosts' copies)."""

    def __init__(self, remote: Iterable[str], local: Iterable[str] = ()):
        self.remote = _parts(remote)
        self.parts = {**_parts(local), **self.remote}
        self.name = hashlib.sha256("\0".join(sorted(self.remote)).encode()).hexdigest()[:16]

    @property
    def source(self) -> Path:
        """The folder a `-scripts` copy takes (its `lib` folder lands in the SSH user's ~/.gpucluster)."""
        return SHIP_DIR / self.name / LIB_DIR.name

    def write(self) -> None:
        """Every part as a file (written whole under a temporary name first; one already there is kept)."""
        for folder, parts in ((LIB_DIR, self.parts), (self.source, self.remote)):
            folder.mkdir(parents=True, exist_ok=True)
            for sha, text in parts.items():
                path = folder / f"{sha}.sh"
                if not path.exists():
                    tmp = path.with_suffix(f".tmp{os.getpid()}")
                    tmp.write_text(text)
                    tmp.replace(path)

    def factor(self, text: str, user: str | None, *, undo: bool = False) -> str:
        """`text` with each shared part replaced by the lines that run its file: on the host in `user`'s home,
        checked against its SHA-256 first, or with `user` None where the program runs (a local command).
        `undo`: `text` is a remote delete, run from the copy its create's apply shipped, whenever it runs
        (the host keeps every part it was sent); where that copy is gone, it undoes nothing and says so."""
        assert user or not undo, "a local delete keeps its whole text"
        out, last = [], 0
        for start, end, part in shared_parts(text):
            sha = hashlib.sha256(part.encode()).hexdigest()
            if sha not in (self.remote if user else self.parts):
                continue
            where = f"~{user}/{LIB_DIR}/{sha}.sh" if user else f"{LIB_DIR}/{sha}.sh"
            check = (f'[[ "$(sha256sum 2>/dev/null <"$GPUCLUSTER_SHARED" || true)" == "{sha}  -" ]]' if user
                     else '[[ -r "$GPUCLUSTER_SHARED" ]]')
            if undo:
                why = ("is missing or not the part this host was sent: nothing was undone. Was the host reinstalled, "
                       "or its SSH user's home wiped? A host that is gone for good leaves the state with "
                       "pulumi state delete")
            else:
                why = ("is missing or not the part this apply shipped: run pulumi up again ("
                       + ("its -scripts copy puts it there)" if user else "the program writes it where pulumi runs)"))
            out += [text[last:start], f"# gpucluster: shared part {sha}\nGPUCLUSTER_SHARED={where}\n"
                    f"{check} || {{ printf '%s: error: %s\\n' \"$HOST\" \"$GPUCLUSTER_SHARED {why}\" >&2; exit 1; }}\n"
                    f'# shellcheck source=/dev/null  # the part is checked where it is whole (the plan)\n'
                    f'. "$GPUCLUSTER_SHARED"\n']
            last = end
        return "".join(out) + text[last:]


_READ: dict[str, str] = {}


def _written(sha: str) -> str | None:
    """A part as the program wrote it, read once per process (named by its hash, it never changes)."""
    if sha not in _READ:
        path = LIB_DIR / f"{sha}.sh"
        if not path.exists():
            return None
        _READ[sha] = path.read_text()
    return _READ[sha]


def expand(text: str) -> str:
    """`text` with each shared part a `Lib` put in its place again, read from where the program wrote it (the
    plan shows whole scripts); a part not found stays as the lines that run it."""
    def part(m: re.Match[str]) -> str:
        found = _written(m["sha"])
        return m[0] if found is None else f"{SHARED_BEGIN}\n{found}{SHARED_END}\n"
    return _LOADER.sub(part, text)


def ship(name: str, target: SshTarget, lib: Lib, private_key: pulumi.Input[str], *,
         parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = ()) -> remote.CopyToRemote:
    """The pool's remote parts onto one host, into ~user/.gpucluster/lib: the state keeps the folder's path and
    hash, not its text (`lib` is written before, once for the pool: the engine hashes the folder when the copy
    registers). A part that changes is a new file beside the old one, and the copy updates in place
    (pulumi-command copies again when the hash changes and removes nothing on delete)."""
    return remote.CopyToRemote(name, connection=connection(target, private_key),
                               source=pulumi.FileArchive(str(lib.source)), remote_path=str(LIB_DIR.parent),
                               opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on)))
