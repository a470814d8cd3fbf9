"""Who is calling: API keys on HTTP and on the websocket, checked against the key store.

HTTP clients send ``Authorization: Bearer <key>`` (what every OpenAI client
does with ``api_key=``). A missing key is 401 ``missing_api_key``, an unknown
or revoked one 401 ``invalid_api_key``, both in OpenAI's error shape with a
``WWW-Authenticate`` header.

Websocket clients have three ways, because browsers cannot set headers on a
websocket:

* an ``Authorization: Bearer <key>`` header (programs);
* the subprotocol list: offer ``specstream.v1`` and ``specstream.key.<key>``;
  the edge answers with ``specstream.v1`` only, so the key is never echoed
  (``new WebSocket(url, ["specstream.v1", "specstream.key." + key])``);
* a first frame ``{"type": "auth", "api_key": "<key>"}``, answered by
  ``{"type": "auth", "ok": true, "tenant": ...}`` (what the browser page does).

A query parameter is deliberately not accepted: URLs end up in access logs and
browser history. A socket without a valid key is closed with code 1008 (policy
violation) and a reason that never contains the key.

With ``edge.auth.enabled: false`` every caller is the tenant ``default`` with
the default limits; the edge logs a warning at start and ``specstream up``
prints one.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

from streams.edge.key_store import KeyStore
from streams.edge.keys import Principal, TenantLimits, keys_file_path
from streams.wire import errors

log = logging.getLogger(__name__)

WS_PROTOCOL = "specstream.v1"
WS_KEY_PROTOCOL_PREFIX = "specstream.key."
ANONYMOUS_TENANT = "default"
_BEARER = re.compile(r"^\s*bearer(?:\s+(\S*))?\s*$", re.IGNORECASE)
WS_CLOSE_POLICY = 1008  # policy violation: no key, or a wrong one
WS_CLOSE_TOO_BIG = 1009  # message too big


def key_from_headers(headers: Mapping[str, str]) -> str | None:
    value = headers.get("authorization")
    if not value:
        return None
    match = _BEARER.match(value)
    if match:
        return match.group(1) or None  # "Bearer" with nothing after it: no key
    return value.strip() or None  # another scheme: a wrong key, not a missing one


def key_from_subprotocols(protocols: Iterable[str]) -> str | None:
    for protocol in protocols:
        if protocol.startswith(WS_KEY_PROTOCOL_PREFIX) and len(protocol) > len(WS_KEY_PROTOCOL_PREFIX):
            return protocol[len(WS_KEY_PROTOCOL_PREFIX):]
    return None


class Authenticator:
    def __init__(self, *, enabled: bool, keys_file: str | None, key_hashes: Iterable[str] = (),
                 defaults: TenantLimits = TenantLimits()) -> None:
        self.enabled = enabled
        self.defaults = defaults
        self.store: KeyStore | None = None
        if enabled:
            self.store = KeyStore(keys_file_path(keys_file), defaults=defaults, key_hashes=key_hashes)
            if self.store.active_keys == 0:
                log.warning("auth: no API key exists yet (%s); every call gets 401 until one is created with "
                            "`specstream keys create --tenant NAME`", self.store.path)
        else:
            log.warning("auth: DISABLED (edge.auth.enabled: false): anyone who can reach this edge may use it")

    def authenticate(self, key: str | None) -> Principal:
        """The caller's principal; raises a 401 EdgeError when auth is on and the key is missing or unknown."""
        if not self.enabled or self.store is None:
            return Principal(ANONYMOUS_TENANT, "-", self.defaults)
        if not key:
            raise errors.missing_api_key()
        principal = self.store.lookup(key)
        if principal is None:
            raise errors.invalid_api_key()
        return principal
