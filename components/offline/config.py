"""A stack's settings as the Pulumi CLI hands them to a program (Pulumi.yaml, then Pulumi.<stack>.yaml), read
without importing Pulumi, so commands that only need them (validate, schema) start fast."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..spec import SpecError
from ..spec.loader import PRIVATE_KEY_RE, read_bounded
from ..spec.slurm import DIRECTORY_PASSWORD, directory_password_problem
from ..spec.storage import STORAGE_API_PASSWORD


# Secrets the program reads only where the spec asks for them (secret_settings of SlurmSettings and StorageSpec), so
# Pulumi.yaml cannot declare them (a declared key without a default is required of every stack): a plain-text
# value is still reported.
OPTIONAL_SECRETS = (DIRECTORY_PASSWORD, STORAGE_API_PASSWORD)


@dataclass
class StackConfig:
    project: str
    values: dict[str, str]                 # fully qualified key -> string, as the CLI hands them over
    secret_keys: list[str]
    unresolved_secrets: list[str] = field(default_factory=list)
    plain_secrets: list[str] = field(default_factory=list)   # secrets (or private keys) written in plain text


def load_stack_config(project_dir: Path, stack: str, needed: tuple[str, ...] = ()) -> StackConfig:
    """Project defaults from Pulumi.yaml, then Pulumi.<stack>.yaml. Encrypted (`secure:`) values cannot be
    decrypted without the engine, and a declared secret, or one the spec needs (`needed`), may not be set yet:
    all become a secret placeholder and are listed as unresolved."""
    project_file = _read_yaml(project_dir / "Pulumi.yaml")
    project = project_file.get("name")
    if not isinstance(project, str):
        raise SpecError(str(project_dir / "Pulumi.yaml"), [f"{project_dir / 'Pulumi.yaml'}: no project name"])

    def qualify(key: str) -> str:
        return key if ":" in key else f"{project}:{key}"

    def encode(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    values: dict[str, str] = {}
    secret_keys: set[str] = set()
    unresolved: list[str] = []
    for key, decl in (project_file.get("config") or {}).items():
        if isinstance(decl, dict):
            if "default" in decl:
                values[qualify(key)] = encode(decl["default"])
            elif "value" in decl:
                values[qualify(key)] = encode(decl["value"])
            if decl.get("secret"):
                secret_keys.add(qualify(key))
        else:
            values[qualify(key)] = encode(decl)
    plain: list[str] = []
    optional = {qualify(k) for k in OPTIONAL_SECRETS}
    stack_file = project_dir / f"Pulumi.{stack}.yaml"
    if stack_file.exists():
        config = _read_yaml(stack_file).get("config") or {}
        if not isinstance(config, dict):
            raise SpecError(str(stack_file), [f"{stack_file}: config is not a mapping of keys to values"])
        for key, value in config.items():
            if isinstance(value, dict) and set(value) == {"secure"}:
                values[qualify(key)] = f"offline-placeholder-for-{qualify(key)}"
                secret_keys.add(qualify(key))
                unresolved.append(qualify(key))
            else:
                values[qualify(key)] = encode(value)
                if qualify(key) in secret_keys | optional or PRIVATE_KEY_RE.search(values[qualify(key)]):
                    plain.append(qualify(key))
                if qualify(key) == qualify(DIRECTORY_PASSWORD) and \
                        (problem := directory_password_problem(values[qualify(key)])):
                    raise SpecError(str(stack_file), [f"{stack_file}: {qualify(key)}: {problem}"])
    secret_keys.update(qualify(k) for k in needed)
    for key in sorted(secret_keys):     # declared secrets no stack file sets (they live in the engine's state)
        if key not in values:
            values[key] = f"offline-placeholder-for-{key}"
            unresolved.append(key)
    return StackConfig(project, values, sorted(secret_keys), sorted(unresolved), sorted(plain))


def _read_yaml(path: Path) -> dict[str, Any]:
    """A Pulumi settings file as a mapping; anything else is bad input naming the file."""
    try:
        data = yaml.safe_load(read_bounded(path, "a Pulumi settings file").decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise SpecError(str(path), [f"{path}: cannot be read as YAML ({str(e)[:200]}); fix the file"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(str(path), [f"{path}: holds a {type(data).__name__}, not a mapping of settings"])
    return data
