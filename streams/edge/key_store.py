"""The edge's read-only view of the API keys: key -> Principal, re-reading the keys file when it changes.

The file's format and the CLI's writers are :mod:`streams.edge.keys`. The file
is checked at most once a second, so ``keys create`` and ``keys revoke`` take
effect on a running edge without a restart; a file edited into something
invalid is logged and the previous keys stay in force. Keys from
``edge.auth.key_hashes`` (``tenant:<sha256>``) need no file.
"""
from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Iterable
from pathlib import Path

from streams.edge.keys import (
    SHA256_HEX, KeyFile, KeyRecord, KeyStoreError, Principal, TenantLimits, check_tenant, hash_key, read_key_file,
)

log = logging.getLogger(__name__)

_RELOAD_EVERY_S = 1.0


def parse_key_hashes(entries: Iterable[str]) -> dict[str, str]:
    """'tenant:sha256-hex' entries -> {digest: tenant}."""
    out: dict[str, str] = {}
    for entry in entries:
        tenant, sep, digest = entry.strip().rpartition(":")
        digest = digest.lower()
        if not sep or not SHA256_HEX.match(digest):
            raise KeyStoreError(f"edge.auth.key_hashes: {entry[:24]!r}... is not 'tenant:<sha256 hex>'")
        out[digest] = check_tenant(tenant)
    return out


class KeyStore:
    """The edge's read-only view: key -> Principal, re-reading the file when it changes."""

    def __init__(self, path: Path | None, *, defaults: TenantLimits = TenantLimits(),
                 key_hashes: Iterable[str] = ()) -> None:
        self.path = path
        self.defaults = defaults
        self._env = parse_key_hashes(key_hashes)
        self._data = KeyFile()
        self._by_hash: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at = 0.0
        self.reload(force=True)

    def _file_stamp(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def reload(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked_at < _RELOAD_EVERY_S:
            return
        self._checked_at = now
        stamp = self._file_stamp()
        if not force and stamp == self._stamp:
            return
        try:
            data = read_key_file(self.path) if self.path is not None else KeyFile()
        except KeyStoreError as error:
            if force:
                raise
            log.error("keeping the previous keys: %s", error)  # a bad edit must not lock everyone out
            return
        self._data = data
        self._by_hash = {k.sha256: k for k in data.keys if k.active}
        self._stamp = stamp
        log.info("keys: %d active key(s) from %s, %d from settings", len(self._by_hash),
                 self.path if self.path is not None else "no file", len(self._env))

    @property
    def active_keys(self) -> int:
        return len(self._by_hash) + len(self._env)

    def limits_for(self, tenant: str) -> TenantLimits:
        return self._data.limits_for(tenant, self.defaults)

    def lookup(self, key: str) -> Principal | None:
        self.reload()
        digest = hash_key(key)
        record = self._by_hash.get(digest)
        if record is not None and hmac.compare_digest(record.sha256, digest):
            return Principal(record.tenant, record.id, self.limits_for(record.tenant), self._data.log_prompts(record.tenant))
        tenant = self._env.get(digest)
        if tenant is not None:
            return Principal(tenant, f"env-{digest[:8]}", self.limits_for(tenant), self._data.log_prompts(tenant))
        return None

    def records(self) -> list[KeyRecord]:
        self.reload(force=True)
        return list(self._data.keys)
