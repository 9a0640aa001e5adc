"""Package repositories as a host gets them: each spec entry an apt source or a dnf repository section, only for
hosts of its OS family (an EL host never gets an apt source, nor a Debian one a dnf repository)."""

from __future__ import annotations

from typing import NamedTuple, Sequence

from .bash import call
from .spec.common import PackageRepository


# Refreshes only the list file @APT_LIST@ names (the host's other sources are not fetched: an air-gapped host
# cannot reach them), keeping the other sources' lists.
APT_UPDATE = ("apt-get update -qq -o Dir::Etc::sourcelist=@APT_LIST@ -o Dir::Etc::sourceparts=- "
              "-o APT::Get::List-Cleanup=0")


class RepoFiles(NamedTuple):
    apt_list: str          # the sources.list.d file's lines ("" without a debian repository)
    apt_keys: str          # script lines that fetch the signing keys the apt lines name (":" without any)
    yum_repo: str          # the yum.repos.d file's sections ("" without an el repository)


def repo_files(repo_id: str, title: str, repositories: Sequence[PackageRepository]) -> RepoFiles:
    """`repo_id` names the files, keyrings and dnf sections (`<repo_id>`, then `<repo_id>-2` ...)."""
    lines, keys, sections = [], [], []
    for family in ("debian", "el"):
        for n, r in enumerate((r for r in repositories if r.os_family == family), start=1):
            name = repo_id if n == 1 else f"{repo_id}-{n}"
            if family == "el":
                sections.append(f"[{name}]\nname={title}\nbaseurl={r.url}\nenabled=1\n"
                                + (f"gpgcheck=1\ngpgkey={r.gpg_key_url}" if r.gpg_key_url else "gpgcheck=0"))
                continue
            keyring = f"/etc/apt/keyrings/{name}.asc"
            if r.gpg_key_url:
                keys.append(call("curl", "-fsSL", "--create-dirs", "-o", keyring, r.gpg_key_url))
            lines.append(" ".join(["deb", f"[signed-by={keyring}]" if r.gpg_key_url else "[trusted=yes]", r.url,
                                   r.apt_suite, *r.apt_components]))
    return RepoFiles("\n".join(lines), "\n".join(keys) or ":  # trusted=yes: unsigned", "\n\n".join(sections))
