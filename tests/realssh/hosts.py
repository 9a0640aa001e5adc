"""Real OpenSSH servers in network namespaces, one per test host, each with its own filesystem view.

Each host is a network namespace on a bridge (addresses from 198.18.0.0/15, the benchmarking range, made by
this run and nowhere routed) running a real sshd inside a private mount namespace, where overlays over /etc,
/usr/local, /usr/sbin, /opt, /var/lib, /var/cache, /srv and /root, and a tmpfs /dev/shm, take every write the
scripts make;
the test machine itself is never changed. Tests read and plant files through each host's upper directories.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from components.ssh import as_command

from .doubles import ALL_REDUCE, DOUBLES, HEALTHY, OPENSM, STATE_DIR, state_env

OVERLAID = ("/etc", "/usr/local", "/usr/sbin", "/opt", "/var/lib", "/var/cache", "/srv", "/root")
# root's shell startup files on a test host: a GPU host's, not this machine's (whose ~/.bashrc, which bash reads for
# every SSH command, puts pyenv's shims first in PATH and runs `pyenv init`, a third of a second per command).
ROOT_DOTFILES = (".bashrc", ".profile", ".bash_profile", ".bash_login")
# apt as a server keeps it: its binary package cache, which this machine's container image turns off
# (/etc/apt/apt.conf.d/docker-clean), so that every apt-mark or apt-cache call reads all the package lists again
# (over a second each; host preparation asks `apt-mark showhold` on every run).
APT_CACHE = ('# test host: apt keeps its package cache, as on a server\n'
             'Dir::Cache::pkgcache "pkgcache.bin";\nDir::Cache::srcpkgcache "srcpkgcache.bin";\n')
# Parts of /sys each test host sees from its own fake tree (bind-mounted over the real one).
FAKE_SYSFS = ("class", "kernel", "devices/system/cpu", "module")
# Data-plane NICs of every test host: a real veth interface (its MTU really changes) plus the RDMA device's
# sysfs and configfs entries, which only a ConnectX card would create, in a tree bound over /sys/class and
# /sys/kernel inside the host's mount namespace. An InfiniBand port's tree is the one the real `ibstat`
# (infiniband-diags, through libibumad) reads: the hosts' ibstat is the machine's own.
NICS = (("mlx5_0", "ens1f0np0"), ("mlx5_1", "ens2f0np0"))
# (RDMA device, interface[, link layer]) of each data-plane NIC: RoCE (Ethernet) unless "InfiniBand" is named
Nics = tuple[tuple[str, ...], ...]
TOOLS = ("ip", "unshare", "ssh", "ssh-keygen", "mount")


def unavailable() -> str | None:
    """Why real test hosts cannot run here, or None."""
    if os.geteuid() != 0:
        return "real SSH test hosts need root (network and mount namespaces)"
    missing = [t for t in TOOLS if shutil.which(t) is None] + \
        ([] if Path("/usr/sbin/sshd").exists() else ["sshd (openssh-server)"])
    if missing:
        return f"missing {', '.join(missing)} (.ci/run installs openssh-server and iproute2)"
    probe = subprocess.run(["ip", "netns", "add", "gcprobe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create network namespaces: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "gcprobe"], capture_output=True)
    return None


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@dataclass
class TestHost:
    name: str
    address: str
    root: Path
    netns: str
    host_key: str = ""
    process: subprocess.Popen | None = None
    shell: object = None          # runs a command on the host over SSH (set by TestHosts)

    def upper(self, path: str) -> Path:
        """Where a path under an overlaid directory lands on this host (e.g. /etc/fstab)."""
        top = next(t for t in OVERLAID if path == t or path.startswith(t + "/"))
        return self.root / top.strip("/").replace("/", "_") / "up" / path[len(top):].lstrip("/")

    def read(self, path: str) -> str:
        return self.upper(path).read_text()

    def exists(self, path: str) -> bool:
        return self.upper(path).exists()

    def plant(self, path: str, text: str, mode: int = 0o644) -> None:
        p = self.upper(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(mode)

    # Changes to a running host go through the host itself: the upper directories are read-only to tests
    # once mounted (overlayfs does not promise to notice changes made beside it).
    def sh(self, command: str) -> None:
        out = self.shell(self, command)
        assert out.returncode == 0, out.stderr

    def put(self, path: str, text: str) -> None:
        """Write a file on the running host (as `plant` does before it starts)."""
        self.sh(f"mkdir -p {shlex.quote(os.path.dirname(path))} && printf '%s' {shlex.quote(text)} > {shlex.quote(path)}")

    def set_hardware(self, **state: str) -> None:
        self.sh(f"rm -f {STATE_DIR}/removed-pods && "       # pods `crictl rmp` removed come back with new ones
                f"cat > {STATE_DIR}/state.env <<'EOF'\n{state_env({**HEALTHY, **state})}EOF")

    @contextmanager
    def without(self, tool: str) -> Iterator[None]:
        """The host lacks `tool` inside the block."""
        self.sh(f"mv /usr/local/bin/{tool} /usr/local/bin/{tool}.off")
        try:
            yield
        finally:
            self.sh(f"mv /usr/local/bin/{tool}.off /usr/local/bin/{tool}")

    @contextmanager
    def hardware(self, **state: str) -> Iterator[None]:
        """The host's simulated hardware differs from a healthy one inside the block."""
        self.set_hardware(**state)
        try:
            yield
        finally:
            self.set_hardware()

    def port_guid(self, device: str) -> str:
        """The port GUID of `device` as its fake tree holds it (gids/0's low 64 bits), as ibstat prints it."""
        gid = self.sysfs(f"/sys/class/infiniband/{device}/ports/1/gids/0").read_text().strip()
        return "0x" + gid.split(":", 4)[4].replace(":", "")

    def sysfs(self, path: str) -> Path:
        """Where a /sys/class, /sys/kernel or /sys/devices/system/cpu path of this host's fake tree lives."""
        top = next(t for t in FAKE_SYSFS if path.startswith(f"/sys/{t}/"))
        return self.root / f"sys_{top.replace('/', '_')}" / path[len(f"/sys/{top}/"):]

    def calls(self) -> list[str]:
        log = self.upper(f"{STATE_DIR}/calls.log")
        return log.read_text().splitlines() if log.exists() else []

    def clear_calls(self) -> None:
        self.sh(f"rm -f {STATE_DIR}/calls.log")


@dataclass
class TestHosts:
    __test__ = False              # a fixture's class, not tests, wherever a test module imports it
    work: Path
    names: list[str]
    # each host's data-plane NICs, where they differ from NICS (dev's): a stack's own, by hostname
    nics: dict[str, Nics] = field(default_factory=dict)
    hosts: dict[str, TestHost] = field(default_factory=dict)
    started = 0                   # sets of hosts this process made: each gets its own names

    def __post_init__(self) -> None:
        n = TestHosts.started
        TestHosts.started += 1
        self.tag = f"{os.getpid() % 10000}" + (f"x{n}" if n else "")
        self.octet = os.getpid() % 250            # start() steps past a subnet another set holds
        self.bridge = f"gcb{self.tag}"
        self.client_key = self.work / "client_ed25519"

    def _netns(self, i: int) -> str:
        return f"gc{self.tag}h{i}"

    def start(self) -> TestHosts:
        # a subnet another set of hosts holds (one a killed run left behind) would take these hosts' traffic
        held = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
        while f" 198.18.{self.octet}." in held:
            self.octet = (self.octet + 1) % 250
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.client_key))
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)       # sshd's privilege separation directory
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "addr", "add", f"198.18.{self.octet}.1/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, name in enumerate(self.names):
            self.hosts[name] = self._start_host(i, name)
        for host in self.hosts.values():
            self._wait(host)
        return self

    def _start_host(self, i: int, name: str) -> TestHost:
        host = TestHost(name, f"198.18.{self.octet}.{10 + i}", self.work / name, self._netns(i),
                        shell=lambda h, command: self.ssh(h, command))
        for top in OVERLAID:
            for part in ("up", "work"):
                (host.root / top.strip("/").replace("/", "_") / part).mkdir(parents=True, exist_ok=True)
        # root must be able to log in with a key while the image's root password is locked
        shadow = Path("/etc/shadow").read_text().splitlines()
        host.plant("/etc/shadow", "\n".join(":".join(["root", "*", *l.split(":")[2:]]) if l.startswith("root:")
                                            else l for l in shadow) + "\n", 0o640)
        host.plant("/etc/fstab", "# test host fstab\nproc /proc proc defaults 0 0\n")
        for dotfile in ROOT_DOTFILES:
            host.plant(f"/root/{dotfile}", "# test host: root's shell as a fresh GPU host starts it\n")
        host.plant("/etc/apt/apt.conf.d/zz-gpucluster-test-host", APT_CACHE)
        for tool, text in DOUBLES.items():
            host.plant(f"/usr/local/bin/{tool}", text, 0o755)
        host.plant("/usr/sbin/opensm", OPENSM, 0o755)              # where its unit starts it
        host.plant("/opt/nccl-tests/build/all_reduce_perf", ALL_REDUCE, 0o755)
        host.plant(f"{STATE_DIR}/state.env", state_env(HEALTHY))
        host.plant(f"{STATE_DIR}/enabled/kubelet", "")               # a node that already joined the cluster
        host.plant(f"{STATE_DIR}/active/kubelet", "")
        keyfile = host.root / "ssh_host_ed25519_key"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keyfile))
        host.host_key = " ".join(Path(f"{keyfile}.pub").read_text().split()[:2])
        (host.root / "authorized_keys").write_text(Path(f"{self.client_key}.pub").read_text())
        (host.root / "sshd_config").write_text(
            f"Port 22\nListenAddress {host.address}\nHostKey {keyfile}\nPidFile {host.root}/sshd.pid\n"
            f"AuthorizedKeysFile {host.root}/authorized_keys\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "PrintMotd no\nSubsystem sftp internal-sftp\n")
        nics = self.nics.get(name, NICS)
        self._fake_devices(host, i, nics)
        veth, peer = f"gcv{self.tag}{i}", f"gcp{self.tag}{i}"
        _run("ip", "netns", "add", host.netns)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", peer)
        _run("ip", "link", "set", veth, "master", self.bridge, "up")
        _run("ip", "link", "set", peer, "netns", host.netns)
        ns = ("ip", "netns", "exec", host.netns)
        _run(*ns, "ip", "link", "set", "lo", "up")
        _run(*ns, "ip", "addr", "add", f"{host.address}/24", "dev", peer)
        _run(*ns, "ip", "link", "set", peer, "up")
        for _, ifname, *_ in nics:
            _run(*ns, "ip", "link", "add", ifname, "type", "veth", "peer", "name", f"{ifname}p")
        mounts = "; ".join(
            f"mount -t overlay overlay -o lowerdir={top},upperdir={host.root}/{top.strip('/').replace('/', '_')}/up,"
            f"workdir={host.root}/{top.strip('/').replace('/', '_')}/work {top}" for top in OVERLAID)
        mounts += "".join(f"; mount --bind {host.root}/sys_{t.replace('/', '_')} /sys/{t}" for t in FAKE_SYSFS)
        # /proc/fs, where kernel filesystem modules (BeeGFS's client) publish their state: a tree of the test's
        (host.root / "proc_fs").mkdir(exist_ok=True)
        mounts += f"; mount --bind {host.root}/proc_fs /proc/fs"
        boot = f"set -e; {mounts}; mount -t tmpfs -o size=64m tmpfs /dev/shm; exec /usr/sbin/sshd -D -e -f {host.root}/sshd_config"
        log = open(host.root / "sshd.log", "w")
        host.process = subprocess.Popen([*ns, "unshare", "--mount", "--propagation", "private", "bash", "-c", boot],
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return host

    @staticmethod
    def _fake_devices(host: TestHost, i: int, nics: Nics) -> None:
        def put(path: str, text: str) -> None:
            p = host.sysfs(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text + "\n")
        for n, (dev, ifname, *layer) in enumerate(nics):
            port = f"/sys/class/infiniband/{dev}/ports/1"
            put(f"{port}/state", "4: ACTIVE")                 # the RDMA core's forms (ib_sysfs)
            put(f"{port}/phys_state", "5: LinkUp")
            put(f"{port}/counters/link_downed", "0")
            host.sysfs(f"/sys/class/infiniband/{dev}/device/net/{ifname}").mkdir(parents=True)
            # the PCI device from the netdev's side (one directory, two links on a real host)
            host.sysfs(f"/sys/class/net/{ifname}/device/infiniband/{dev}").mkdir(parents=True)
            if layer == ["InfiniBand"]:
                TestHosts._infiniband_port(put, dev, ifname, guid=f"b83f:d203:00{i:02x}:{n:02x}10", lid=16 * i + n + 2)
                continue
            for point in ("roce_np", "roce_rp"):
                for prio in range(8):
                    put(f"/sys/class/net/{ifname}/ecn/{point}/enable/{prio}", "0")
            put(f"/sys/class/net/{ifname}/ecn/roce_np/cnp_dscp", "48")
            put(f"{port}/link_layer", "Ethernet")
            ipv4 = f"0000:0000:0000:0000:0000:ffff:c612:{i:02x}{n:02x}"
            for idx, (kind, gid) in enumerate((("IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0001"),
                                               ("RoCE v2", "fe80:0000:0000:0000:0000:0000:0000:0001"),
                                               ("IB/RoCE v1", ipv4), ("RoCE v2", ipv4))):
                put(f"{port}/gid_attrs/types/{idx}", kind)
                put(f"{port}/gids/{idx}", gid)
            put(f"/sys/class/infiniband/{dev}/tc/1/traffic_class", "Global tclass=0")
            put(f"/sys/kernel/config/rdma_cm/{dev}/ports/1/default_roce_mode", "IB/RoCE v1")
            put(f"/sys/kernel/config/rdma_cm/{dev}/ports/1/default_roce_tos", "0")
        for cpu in range(4):
            put(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", "powersave")
        for top in FAKE_SYSFS:           # each tree exists, also one no device fills (modprobe's double loads modules)
            (host.root / f"sys_{top.replace('/', '_')}").mkdir(exist_ok=True)

    @staticmethod
    def _infiniband_port(put, dev: str, ifname: str, guid: str, lid: int) -> None:
        """An NDR HCA's port 1 after the subnet manager's sweep, as mlx5_ib publishes it: what libibumad's
        get_ca/get_port read (a missing file or an empty pkey table makes ibstat refuse the device)."""
        ca = f"/sys/class/infiniband/{dev}"
        for name, value in (("node_type", "1: CA"), ("fw_ver", "28.39.1002"), ("hw_rev", "0x0"),
                            ("node_guid", guid), ("sys_image_guid", guid)):
            put(f"{ca}/{name}", value)
        port = f"{ca}/ports/1"
        for name, value in (("link_layer", "InfiniBand"), ("rate", "400 Gb/sec (4X NDR)"), ("lid", f"{lid:#x}"),
                            ("lid_mask_count", "0"), ("sm_lid", "0x1"), ("sm_sl", "0"), ("cap_mask", "0xa751e848"),
                            ("gids/0", f"fe80:0000:0000:0000:{guid}"), ("pkeys/0", "0xffff")):
            put(f"{port}/{name}", value)
        put(f"/sys/class/net/{ifname}/mode", "datagram")                 # IPoIB's (ipoib_cm)

    def _wait(self, host: TestHost, timeout_s: float = 10) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if host.process.poll() is not None:
                raise RuntimeError(f"sshd of {host.name} exited: {(host.root / 'sshd.log').read_text()}")
            try:
                socket.create_connection((host.address, 22), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"sshd of {host.name} did not listen within {timeout_s}s")

    def ssh(self, host: TestHost, command: str, *, user: str = "root", host_key: str | None = None,
            timeout_s: float = 60, stdin: str | None = None) -> subprocess.CompletedProcess:
        """Run `command` as pulumi-command would: one SSH exec request, the host key pinned, `stdin` (the
        command's stdin input) on the session's standard input."""
        known = self.work / f"known_hosts_{host.name}"
        known.write_text(f"{host.address} {host_key or host.host_key}\n")
        return subprocess.run(
            ["ssh", "-i", str(self.client_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
             "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=5",
             f"{user}@{host.address}", command], capture_output=True, text=True, timeout=timeout_s,
            input=stdin if stdin is not None else "")

    def roll(self, host: TestHost, script: str, drained: str = "go") -> subprocess.CompletedProcess:
        """The rollout's roll step as push() runs it: the drain's outcome (rollout.drain_outcome) on its
        standard input. A failure is its stdout's `roll failed:` line (rollout.roll_failure), exit 0."""
        return self.ssh(host, as_command(script, "root", stdin=True), stdin=drained, timeout_s=120)

    def stop(self) -> None:
        """Everything gone before the next module starts hosts under the same names: a process a killed script
        left in a namespace (the interruption tests make them) would keep the namespace, and with it the veth
        pair, alive after `ip netns del`, so what is still in it is killed and the pair is deleted by name."""
        for i, name in enumerate(self.names):            # every host's, also one whose start failed half-way
            host = self.hosts.get(name)
            if host and host.process and host.process.poll() is None:
                os.killpg(host.process.pid, signal.SIGTERM)
                host.process.wait(timeout=10)
            netns = self._netns(i)
            left = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
            for pid in left:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
            subprocess.run(["ip", "link", "del", f"gcv{self.tag}{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
