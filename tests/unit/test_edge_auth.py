"""API keys: the hashed store, key extraction, the `specstream keys` commands and what `specstream up` does about auth."""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from streams.commands.keys import curl_auth, prepare_up
from streams.commands.keys import main as keys_main
from streams.config import load_settings
from streams.edge.auth import Authenticator, key_from_headers, key_from_subprotocols
from streams.edge.key_store import KeyStore
from streams.edge.keys import (
    KeyStoreError,
    TenantLimits,
    create_key,
    ensure_local_key,
    hash_key,
    read_key_file,
    revoke_keys,
)
from streams.wire import errors

DEFAULTS = TenantLimits(rpm=600, tpm=500_000, concurrency=32)


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    return tmp_path / "cfg" / "keys.json"


def test_create_stores_only_the_hash_privately_and_the_key_authenticates(keys_file: Path) -> None:
    key, record = create_key(keys_file, "alice", rpm=60, concurrency=0)
    assert key.startswith(f"sk-ss-{record.id}-") and len(key) > 50
    text = keys_file.read_text()
    assert key not in text and key.split("-", 3)[-1] not in text
    assert hash_key(key) in text
    assert stat.S_IMODE(keys_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys_file.parent.stat().st_mode) == 0o700
    principal = KeyStore(keys_file, defaults=DEFAULTS).lookup(key)
    assert principal is not None and principal.tenant == "alice" and principal.key_id == record.id
    # rpm set, concurrency 0 = no limit, tpm from the defaults.
    assert principal.limits == TenantLimits(rpm=60, tpm=500_000, concurrency=None)


def test_wrong_and_revoked_keys_do_not_authenticate_and_the_edge_sees_changes(keys_file: Path) -> None:
    key_a, rec_a = create_key(keys_file, "alice")
    store = KeyStore(keys_file, defaults=DEFAULTS)
    assert store.lookup(key_a + "x") is None and store.lookup("") is None
    key_b, _ = create_key(keys_file, "bob", tpm=1000)
    revoke_keys(keys_file, key_id=rec_a.id)
    time.sleep(1.05)  # the store re-reads the file at most once a second
    assert store.lookup(key_a) is None
    bob = store.lookup(key_b)
    assert bob is not None and bob.tenant == "bob" and bob.limits.tpm == 1000
    assert [k.active for k in read_key_file(keys_file).keys] == [False, True]


def test_revoking_a_tenant_revokes_all_its_keys_and_bad_ids_or_names_are_refused(keys_file: Path) -> None:
    create_key(keys_file, "carol")
    create_key(keys_file, "carol")
    assert len(revoke_keys(keys_file, tenant="carol")) == 2
    with pytest.raises(KeyStoreError, match="no active key"):
        revoke_keys(keys_file, tenant="carol")
    with pytest.raises(KeyStoreError, match="at least 4"):
        revoke_keys(keys_file, key_id="ab")
    with pytest.raises(KeyStoreError, match="tenant"):
        create_key(keys_file, "no spaces please")


def test_key_hashes_from_settings_authenticate_without_a_file(tmp_path: Path) -> None:
    key = "sk-ss-env00000-secret"
    store = KeyStore(tmp_path / "missing.json", defaults=DEFAULTS, key_hashes=[f"dave:{hash_key(key)}"])
    principal = store.lookup(key)
    assert principal is not None and principal.tenant == "dave" and principal.limits == DEFAULTS
    with pytest.raises(KeyStoreError, match="tenant:<sha256 hex>"):
        KeyStore(None, key_hashes=["nonsense"])


def test_a_broken_keys_file_fails_the_start_but_a_later_bad_edit_keeps_the_old_keys(keys_file: Path) -> None:
    key, _ = create_key(keys_file, "alice")
    store = KeyStore(keys_file)
    keys_file.write_text("{not json")
    time.sleep(1.05)
    assert store.lookup(key) is not None
    with pytest.raises(KeyStoreError, match="not valid JSON"):
        KeyStore(keys_file)


def test_a_missing_or_wrong_key_is_401_and_without_auth_everyone_is_the_default_tenant(keys_file: Path) -> None:
    key, _ = create_key(keys_file, "alice")
    auth = Authenticator(enabled=True, keys_file=str(keys_file), defaults=DEFAULTS)
    with pytest.raises(errors.EdgeError) as missing:
        auth.authenticate(None)
    assert (missing.value.status, missing.value.code) == (401, "missing_api_key")
    assert missing.value.headers["WWW-Authenticate"].startswith("Bearer")
    with pytest.raises(errors.EdgeError) as wrong:
        auth.authenticate("sk-ss-00000000-guess")
    assert (wrong.value.status, wrong.value.code) == (401, "invalid_api_key")
    assert "guess" not in wrong.value.message
    assert auth.authenticate(key).tenant == "alice"
    anonymous = Authenticator(enabled=False, keys_file=None, defaults=DEFAULTS).authenticate(None)
    assert anonymous.tenant == "default" and anonymous.limits == DEFAULTS


def test_the_key_is_read_from_a_bearer_header_or_a_websocket_subprotocol() -> None:
    assert key_from_headers({"authorization": "Bearer sk-1"}) == "sk-1"
    assert key_from_headers({"authorization": "bearer   sk-2 "}) == "sk-2"
    assert key_from_headers({}) is None
    assert key_from_subprotocols(["specstream.v1", "specstream.key.sk-ss-ab_cd"]) == "sk-ss-ab_cd"
    assert key_from_subprotocols(["specstream.v1"]) is None


def test_local_key_is_created_once_and_replaced_when_revoked(keys_file: Path) -> None:
    first = ensure_local_key(keys_file)
    assert first.created and first.path.read_text().strip() == first.key
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    again = ensure_local_key(keys_file)
    assert not again.created and again.key == first.key
    revoke_keys(keys_file, tenant="local")
    third = ensure_local_key(keys_file)
    assert third.created and third.key != first.key
    assert KeyStore(keys_file).lookup(third.key).tenant == "local"


def test_keys_cli_prints_a_key_only_when_creating_it_and_lists_hashes_and_revokes_it(
        keys_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.environ.pop("SPECSTREAM_CONFIG", None)
    base = ["--config", os.devnull, "--file", str(keys_file)]
    assert keys_main([*base, "create", "--tenant", "erin", "--rpm", "5", "--tpm", "0"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert key.startswith("sk-ss-") and "only time" in err and key not in err
    assert keys_main([*base, "list"]) == 0
    out, _ = capsys.readouterr()
    assert "erin" in out and "rpm=5 tpm=unlimited concurrency=32" in out and key not in out
    assert keys_main([*base, "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed[0]["tenant"] == "erin" and listed[0]["limits"] == {
        "rpm": 5, "tpm": None, "concurrency": 32, "batch_tokens_per_day": 20_000_000, "batch_queued_lines": 100_000}
    assert keys_main([*base, "hash", "--tenant", "erin", key]) == 0
    assert capsys.readouterr().out.strip() == f"erin:{hash_key(key)}"
    assert keys_main([*base, "revoke", listed[0]["id"]]) == 0
    assert keys_main([*base, "revoke", listed[0]["id"]]) == 1
    assert "no active key" in capsys.readouterr().err
    assert keys_main([*base, "list", "--all"]) == 0
    assert "revoked" in capsys.readouterr().out


def test_specstream_cli_has_the_keys_commands(keys_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from streams.cli import main as cli_main

    assert cli_main(["--config", os.devnull, "keys", "--file", str(keys_file), "create", "--tenant", "frank"]) == 0
    assert capsys.readouterr().out.startswith("sk-ss-")
    assert cli_main(["--config", os.devnull, "keys", "--file", str(keys_file), "path"]) == 0
    assert str(keys_file) in capsys.readouterr().out


def test_up_creates_the_local_key_on_its_first_run_and_says_where(keys_file: Path, monkeypatch) -> None:
    monkeypatch.setenv("SPECSTREAM_EDGE__AUTH__KEYS_FILE", str(keys_file))
    settings = load_settings(os.devnull)
    said: list[str] = []
    path = prepare_up(settings, said.append)
    assert path == keys_file.with_name("local.key") and path.is_file()
    assert "created an API key for tenant 'local'" in said[0] and str(path) in said[0]
    key = path.read_text().strip()
    assert key not in "\n".join(said)
    said.clear()
    assert prepare_up(settings, said.append) == path and "created" not in said[0]
    assert curl_auth(path) == f'-H "Authorization: Bearer $(cat {path})" '


def test_up_warns_loudly_when_auth_is_off(monkeypatch) -> None:
    monkeypatch.setenv("SPECSTREAM_EDGE__AUTH__ENABLED", "false")
    monkeypatch.setenv("SPECSTREAM_EDGE__HOST", "0.0.0.0")
    said: list[str] = []
    assert prepare_up(load_settings(os.devnull), said.append) is None
    text = "\n".join(said)
    assert "WARNING: API keys are OFF" in text and "reachable from the network" in text and text.count("!!") >= 4
    assert curl_auth(None) == ""
