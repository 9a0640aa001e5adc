"""Doubles for the tools that need a GPU, shared by the unit tests and the e2e: each prints real output the test
gives it."""

from __future__ import annotations

import sys
from pathlib import Path


def nvidia_smi(bin_dir: Path, query: str, links: str, code: int = 0, calls: Path | None = None) -> None:
    """`bin_dir/nvidia-smi`: `nvidia-smi nvlink ...` prints `links`, any other call (`-q ...`) prints `query`;
    it exits `code` and appends its arguments to `calls` when given."""
    (bin_dir / "query.txt").write_text(query)
    (bin_dir / "links.txt").write_text(links)
    tool = bin_dir / "nvidia-smi"
    tool.write_text("#!/bin/bash\n" + (f'echo "$*" >> {calls}\n' if calls else "")
                    + f"if [[ $1 == nvlink ]]; then cat {bin_dir}/links.txt; else cat {bin_dir}/query.txt; fi\n"
                    + f"exit {code}\n")
    tool.chmod(0o755)


def dmesg(bin_dir: Path, kernel_log: str, code: int = 0) -> None:
    """`bin_dir/dmesg`: prints `kernel_log` (what the kernel's ring buffer holds) to stdout and exits `code`."""
    (bin_dir / "kmsg.txt").write_text(kernel_log)
    tool = bin_dir / "dmesg"
    tool.write_text(f"#!/bin/bash\ncat {bin_dir}/kmsg.txt\nexit {code}\n")
    tool.chmod(0o755)


# XID 48 in the driver's line format (NVIDIA's XID catalog: "DBE has been detected"; the sample's 79 line's
# device and fields): the XID that needs NVIDIA's diagnosis, so quarantines until a burn-in.
DOUBLE_BIT_XID = ("[6781742.102345] NVRM: Xid (PCI:0000:91:00): 48, pid='<unknown>', name=<unknown>, An "
                  "uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 0, "
                  "subpartition 0.")


_HEAD = f"#!{sys.executable} -IS\nimport json, os, sys\nS = os.environ['SWITCH_STATE']\n" \
        "st = json.load(open(S))\nargs = sys.argv[1:]\n"
_TAIL = "json.dump(st, open(S, 'w'))\n"

# The switches' CLIs, keeping a running and a saved configuration in SWITCH_STATE (a JSON file; SONiC's
# CONFIG_DB in files beside it) as the real CLIs do: SONiC's CONFIG_DB and `config save`, NVUE's pending/applied
# revisions and `nv config save`, EOS sessions and `copy running-config startup-config`.
SWITCH_CLIS = {
    # SONiC: CONFIG_DB as files KEY/FIELD under running/ (bash: the script calls it for every port and setting);
    # `config` changes it as SONiC's CLI does; `config save` persists it.
    "sonic-db-cli": r'''#!/bin/bash
set -eu
db=$SWITCH_STATE.d/running
case $2 in
  keys) (cd "$db" && compgen -G "$3") || true ;;
  hget) cat "$db/$3/$4" 2>/dev/null || echo ;;
  hset) mkdir -p "$db/$3"; printf '%s' "$5" > "$db/$3/$4" ;;
esac
''',
    "config": r'''#!/bin/bash
set -eu
db=$SWITCH_STATE.d/running
put() { mkdir -p "$db/$1"; printf '%s' "$3" > "$db/$1/$2"; }
case "$1 $2" in
  "interface pfc")
    have=$(cat "$db/PORT_QOS_MAP|$4/pfc_enable" 2>/dev/null || true)
    list=$(tr , '\n' <<<"$have" | sed '/^$/d' | grep -vx "$5" || true)
    if [[ $6 == on ]]; then list=$(printf '%s\n%s\n' "$list" "$5" | sed '/^$/d' | sort -u); fi
    put "PORT_QOS_MAP|$4" pfc_enable "$(paste -sd, <<<"$list")" ;;
  "interface mtu") put "PORT|$3" mtu "$4" ;;
  "ecn -profile") put "WRED_PROFILE|$3" green_min_threshold "$5"; put "WRED_PROFILE|$3" green_max_threshold "$7"
                  put "WRED_PROFILE|$3" green_drop_probability "$9" ;;
  "pfcwd start") put "PFC_WD|$5" action "$4" ;;
  # config vlan (sonic-utilities config/vlan.py): add refuses an existing VLAN; member add refuses a VLAN that
  # does not exist, a port already in it, and a second untagged VLAN on a port; member del one not in it.
  "vlan add") [[ ! -e "$db/VLAN|Vlan$3" ]] || { echo "Error: Vlan$3 already exists" >&2; exit 2; }
              put "VLAN|Vlan$3" vlanid "$3" ;;
  "vlan member")
    untagged=0; args=()
    for a in "${@:4}"; do if [[ $a == -u || $a == --untagged ]]; then untagged=1; else args+=("$a"); fi; done
    vid=${args[0]}; port=${args[1]}; key="VLAN_MEMBER|Vlan$vid|$port"
    case $3 in
      add) [[ -e "$db/VLAN|Vlan$vid" ]] || { echo "Error: Vlan$vid does not exist" >&2; exit 2; }
           [[ ! -e "$db/$key" ]] || { echo "Error: $port is already a member of Vlan$vid" >&2; exit 2; }
           if (( untagged )) && grep -qx untagged "$db"/VLAN_MEMBER\|*\|"$port"/tagging_mode 2>/dev/null; then
             echo "Error: $port is already untagged member!" >&2; exit 2
           fi
           put "$key" tagging_mode "$( ((untagged)) && echo untagged || echo tagged)" ;;
      del) [[ -e "$db/$key" ]] || { echo "Error: $port is not a member of Vlan$vid" >&2; exit 2; }
           rm -rf "${db:?}/$key" ;;
    esac ;;
  "save -y") rm -rf "$SWITCH_STATE.d/saved"; cp -r "$db" "$SWITCH_STATE.d/saved" ;;
  *) echo "config double: $*" >&2; exit 2 ;;
esac
''',
    # NVUE: `nv set`/`unset` edit the pending revision, `config apply` makes it the applied one, `config save`
    # the startup one. A path (every word but the value) holds one value; a bridge's VLANs are a collection.
    "nv": _HEAD + r'''
pending = st.setdefault("pending", list(st["running"]))
if args[0] == "set" and args[1:3] == ["bridge", "domain"] and args[4] == "vlan":
    # a bridge's VLANs are a collection keyed by VLAN ID: setting some adds them (NVUE's `vlan <vid>`)
    st["pending"] = pending + [e for v in args[5].split(",") for e in [" ".join([*args[1:5], v])] if e not in pending]
elif args[0] == "set":
    path = " ".join(args[1:-1])
    st["pending"] = [e for e in pending if e.rsplit(" ", 1)[0] != path] + [" ".join(args[1:])]
elif args[0] == "unset":
    st["pending"] = [e for e in pending if not e.startswith(" ".join(args[1:]))]
elif args[:2] == ["config", "diff"]:
    added = sorted(set(pending) - set(st["running"]))
    removed = sorted(set(st["running"]) - set(pending))
    print("\n".join([f"+ {e}" for e in added] + [f"- {e}" for e in removed]) or "{}")
elif args[:2] == ["config", "apply"]:
    st["running"] = list(pending)
elif args[:2] == ["config", "save"]:
    st["saved"] = list(st["running"])
else:
    sys.exit(f"nv double: {args}")
''' + _TAIL,
    # EOS: a session's lines against the running configuration; `commit` makes them running. (EOS merges a
    # session into the running configuration; this double replaces it, which a switch with one session of
    # ours, the RoCE one, cannot tell apart.)
    "FastCli": _HEAD + r'''
lines = args[args.index("-c") + 1].split("\n")
if lines[0] == "copy running-config startup-config":
    st["saved"] = list(st["running"])
elif lines[-1] == "abort":
    want = lines[1:-2]
    print("\n".join([f"+{e}" for e in want if e not in st["running"]] +
                    [f"-{e}" for e in st["running"] if e not in want]))
elif lines[-1] == "commit":
    st["running"] = lines[1:-1]
''' + _TAIL,
}
