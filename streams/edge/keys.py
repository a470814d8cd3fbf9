"""API keys, stored hashed, each mapped to a tenant; tenants carry their own limits.

The key store is one JSON file (``edge.auth.keys_file``, by default
``~/.config/specstream/keys.json``, or ``$XDG_CONFIG_HOME/specstream/keys.json``)::

    {
      "version": 1,
      "keys": [
        {"id": "3f9a1c2e", "sha256": "<hex digest of the whole key>", "tenant": "alice",
         "created_at": 1732890000.0, "revoked_at": null, "label": null}
      ],
      "tenants": {"alice": {"rpm": 60, "tpm": 100000, "concurrency": 4, "log_prompts": false}}
    }

A key looks like ``sk-ss-3f9a1c2e-<43 url-safe characters>``: 256 random bits
after a public id (the id names the key in ``specstream keys list`` and
``keys revoke``; it is no secret). Only the SHA-256 of the whole key is
stored; the key itself is printed once, when it is created. A fast hash is
enough here, unlike for passwords: a random 256-bit secret cannot be guessed
from its digest, and every API call verifies a key, so it must be cheap.

More keys can come from the environment, without a file:
``edge.auth.key_hashes`` (``SPECSTREAM_EDGE__AUTH__KEY_HASHES='["alice:<sha256>"]'``),
with the digest printed by ``specstream keys hash``.

Limits belong to the tenant, not the key: every key of a tenant shares them.
A tenant limit left out (or a tenant missing from ``tenants``) takes the
configured default (``edge.limits``); ``null`` means no limit. ``log_prompts: false``
keeps the tenant's prompts out of the completions log (the edge marks its requests
``log_prompt: false``; `specstream eval replay` cannot replay them). The edge reads
the file through :class:`streams.edge.key_store.KeyStore`, which re-reads it when it
changes, so ``keys create`` and ``keys revoke`` take effect on a running edge.

Writers (the CLI) take an exclusive lock on ``<file>.lock``, write a temporary
file and rename it into place, so a concurrent reader never sees half a file;
the file and its folder are private to the user (0600 / 0700).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEY_PREFIX = "sk-ss-"
TENANT_PATTERN = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
LOCAL_TENANT = "local"
LOCAL_KEY_FILE = "local.key"
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")


class KeyStoreError(ValueError):
    """A keys file that cannot be read or a request the store cannot carry out (message is one line)."""


def default_keys_file() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "specstream" / "keys.json"


def keys_file_path(configured: str | os.PathLike[str] | None) -> Path:
    return Path(configured).expanduser() if configured else default_keys_file()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def new_key() -> tuple[str, str]:
    """(key id, key)."""
    key_id = secrets.token_hex(4)
    return key_id, f"{KEY_PREFIX}{key_id}-{secrets.token_urlsafe(32)}"


def check_tenant(name: str) -> str:
    if not TENANT_PATTERN.match(name):
        raise KeyStoreError(f"tenant {name!r}: use 1-64 letters, digits, '.', '_' or '-'")
    return name


@dataclass(frozen=True)
class TenantLimits:
    """Per-tenant limits; None: no limit. The batch_ ones bound batch jobs only (streams/edge/batches/quota.py), the others
    interactive requests only: neither kind of work spends the other's budget."""

    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    batch_tokens_per_day: int | None = None
    batch_queued_lines: int | None = None

    def describe(self) -> str:
        return " ".join(f"{name}={'unlimited' if getattr(self, name) is None else getattr(self, name)}"
                        for name in _LIMIT_NAMES)


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant (billed, limited) and which key it used (its public id)."""

    tenant: str
    key_id: str
    limits: TenantLimits = field(default_factory=TenantLimits)
    log_prompts: bool = True  # False: the tenant's prompts stay out of the completions log


@dataclass(frozen=True)
class KeyRecord:
    id: str
    sha256: str
    tenant: str
    created_at: float
    revoked_at: float | None = None
    label: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "sha256": self.sha256, "tenant": self.tenant, "created_at": self.created_at,
                "revoked_at": self.revoked_at, "label": self.label}


_LIMIT_NAMES = ("rpm", "tpm", "concurrency", "batch_tokens_per_day", "batch_queued_lines")
_LOG_PROMPTS = "log_prompts"


@dataclass
class KeyFile:
    """The file's contents."""

    keys: list[KeyRecord] = field(default_factory=list)
    tenants: dict[str, dict[str, int | bool | None]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, where: str) -> "KeyFile":
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as error:
            raise KeyStoreError(f"{where}: not valid JSON ({error.msg} at line {error.lineno})") from None
        if not isinstance(data, dict):
            raise KeyStoreError(f"{where}: expected a JSON object")
        if data.get("version", 1) != 1:
            raise KeyStoreError(f"{where}: unknown version {data.get('version')!r}")
        keys = []
        for i, item in enumerate(data.get("keys", [])):
            try:
                record = KeyRecord(
                    id=str(item["id"]), sha256=str(item["sha256"]).lower(), tenant=check_tenant(str(item["tenant"])),
                    created_at=float(item.get("created_at") or 0.0),
                    revoked_at=None if item.get("revoked_at") is None else float(item["revoked_at"]),
                    label=item.get("label"),
                )
            except (KeyError, TypeError, ValueError, KeyStoreError) as error:
                raise KeyStoreError(f"{where}: keys[{i}] is malformed ({error})") from None
            if not SHA256_HEX.match(record.sha256):
                raise KeyStoreError(f"{where}: keys[{i}].sha256 is not a SHA-256 hex digest")
            keys.append(record)
        tenants: dict[str, dict[str, int | bool | None]] = {}
        raw_tenants = data.get("tenants", {})
        if not isinstance(raw_tenants, dict):
            raise KeyStoreError(f"{where}: 'tenants' must be an object")
        for name, limits in raw_tenants.items():
            if not isinstance(limits, dict):
                raise KeyStoreError(f"{where}: tenants.{name} must be an object")
            clean: dict[str, int | bool | None] = {}
            for limit_name, value in limits.items():
                if limit_name == _LOG_PROMPTS:
                    if not isinstance(value, bool):
                        raise KeyStoreError(f"{where}: tenants.{name}.log_prompts must be true or false")
                    clean[limit_name] = value
                    continue
                if limit_name not in _LIMIT_NAMES:
                    raise KeyStoreError(f"{where}: tenants.{name}.{limit_name}: unknown setting "
                                        f"(use {', '.join(_LIMIT_NAMES)}, log_prompts)")
                if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                    raise KeyStoreError(f"{where}: tenants.{name}.{limit_name} must be a positive integer or null")
                clean[limit_name] = value
            tenants[name] = clean
        return cls(keys, tenants)

    def dumps(self) -> str:
        return json.dumps({"version": 1, "keys": [k.to_json() for k in self.keys], "tenants": self.tenants},
                          indent=2) + "\n"

    def limits_for(self, tenant: str, defaults: TenantLimits) -> TenantLimits:
        own = self.tenants.get(tenant, {})
        return TenantLimits(**{name: own.get(name, getattr(defaults, name)) for name in _LIMIT_NAMES})

    def log_prompts(self, tenant: str) -> bool:
        return self.tenants.get(tenant, {}).get(_LOG_PROMPTS) is not False


def read_key_file(path: Path) -> KeyFile:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return KeyFile()
    except OSError as error:
        raise KeyStoreError(f"cannot read {path}: {error.strerror or error}") from None
    return KeyFile.parse(text, str(path))


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Exclusive lock for read-modify-write of the keys file."""
    _private_dir(path.parent)
    with open(path.with_name(path.name + ".lock"), "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _private_dir(folder: Path) -> None:
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700, exist_ok=True)


def write_private(path: Path, text: str) -> None:
    """Atomically replace ``path`` with ``text``, readable by the owner only."""
    _private_dir(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# --- managing keys (the CLI) ---------------------------------------------------------------------------------------


def create_key(path: Path, tenant: str, *, rpm: int | None = None, tpm: int | None = None,
               concurrency: int | None = None, label: str | None = None, log_prompts: bool | None = None,
               batch_tokens_per_day: int | None = None, batch_queued_lines: int | None = None) -> tuple[str, KeyRecord]:
    """Add a key for ``tenant``; a limit given here (0: no limit) is set on the tenant. Returns (key, record)."""
    check_tenant(tenant)
    with locked(path):
        data = read_key_file(path)
        key_id, key = new_key()
        while any(k.id == key_id for k in data.keys):
            key_id, key = new_key()
        record = KeyRecord(id=key_id, sha256=hash_key(key), tenant=tenant, created_at=time.time(), label=label)
        data.keys.append(record)
        given = {"rpm": rpm, "tpm": tpm, "concurrency": concurrency, "batch_tokens_per_day": batch_tokens_per_day,
                 "batch_queued_lines": batch_queued_lines}
        for name, value in given.items():
            if value is None:
                continue
            if value < 0:
                raise KeyStoreError(f"--{name.replace('_', '-')} must be 0 (no limit) or more")
            data.tenants.setdefault(tenant, {})[name] = value or None
        if log_prompts is not None:
            data.tenants.setdefault(tenant, {})[_LOG_PROMPTS] = log_prompts
        write_private(path, data.dumps())
    return key, record


def revoke_keys(path: Path, *, key_id: str | None = None, tenant: str | None = None) -> list[KeyRecord]:
    """Revoke one key by id (or id prefix of at least 4 characters), or every key of a tenant. Returns what was revoked."""
    if (key_id is None) == (tenant is None):
        raise KeyStoreError("name a key id or a tenant")
    with locked(path):
        data = read_key_file(path)
        if key_id is not None:
            key_id = key_id.removeprefix(KEY_PREFIX)
            if len(key_id) < 4:
                raise KeyStoreError("give at least 4 characters of the key id")
            targets = [k for k in data.keys if k.id.startswith(key_id) and k.active]
            if len(targets) > 1:
                raise KeyStoreError(f"key id {key_id!r} is ambiguous: {', '.join(k.id for k in targets)}")
        else:
            targets = [k for k in data.keys if k.tenant == tenant and k.active]
        if not targets:
            what = f"key {key_id}" if key_id is not None else f"tenant {tenant}"
            raise KeyStoreError(f"no active key for {what} in {path}")
        now = time.time()
        ids = {k.id for k in targets}
        data.keys = [KeyRecord(**{**k.to_json(), "revoked_at": now}) if k.id in ids else k for k in data.keys]
        write_private(path, data.dumps())
    return [k for k in data.keys if k.id in ids]


@dataclass(frozen=True)
class LocalKey:
    path: Path  # the plain key, for `$(cat path)`
    key: str
    created: bool


def local_key_path(keys_file: Path) -> Path:
    return keys_file.with_name(LOCAL_KEY_FILE)


def ensure_local_key(keys_file: Path) -> LocalKey:
    """The key `specstream up` prints: ``local.key`` beside the keys file, created (tenant 'local') on first use.

    Unlike the store, this file holds the key itself (mode 0600), so that
    ``-H "Authorization: Bearer $(cat ~/.config/specstream/local.key)"`` works.
    A revoked or deleted local key is replaced by a new one.
    """
    plain = local_key_path(keys_file)
    with contextlib.suppress(OSError):
        key = plain.read_text(encoding="utf-8").strip()
        if key:
            digest = hash_key(key)
            if any(k.sha256 == digest and k.active for k in read_key_file(keys_file).keys):
                return LocalKey(plain, key, created=False)
    key, _record = create_key(keys_file, LOCAL_TENANT, label="created by specstream up")
    write_private(plain, key + "\n")
    return LocalKey(plain, key, created=True)
