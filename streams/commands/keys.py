"""``specstream keys create|list|revoke|hash|path``: the edge's API keys from the terminal.

    specstream keys create --tenant alice [--rpm 60] [--tpm 100000] [--concurrency 4] [--label NOTE]
                           [--batch-tokens-per-day 5000000] [--batch-queued-lines 20000]
    specstream keys list [--all] [--json]
    specstream keys revoke KEY_ID | --tenant NAME
    specstream keys hash [--tenant NAME] KEY|-      (the digest for edge.auth.key_hashes)
    specstream keys path                           (where the keys file and the local key live)

``create`` prints the key once, on stdout (everything else goes to stderr), so
``KEY=$(specstream keys create --tenant alice)`` works. Limits given to
``create`` are set on the tenant (0: no limit) and shared by all its keys; a
running edge picks up new and revoked keys within a second.

Also here: what ``specstream up`` does about auth (:func:`prepare_up`): create
the local key on the first run and print where it is, or warn loudly when
auth is off.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

from streams.edge.keys import (
    KeyStoreError, create_key, ensure_local_key, hash_key, keys_file_path, local_key_path, read_key_file, revoke_keys,
    TenantLimits,
)

Handler = Callable[[argparse.Namespace, Any], int]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def add_keys_commands(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``keys`` (with its actions) to a parser's subcommands; handlers take (args, settings)."""
    keys = subparsers.add_parser("keys", help="API keys of the edge: create|list|revoke|hash|path",
                                 description=__doc__.split("\n\n")[0])
    _add_actions(keys)
    return keys


def _add_actions(keys: argparse.ArgumentParser) -> None:
    keys.add_argument("--file", help="keys file (default: edge.auth.keys_file, else ~/.config/specstream/keys.json)")
    actions = keys.add_subparsers(dest="keys_action", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create a key for a tenant and print it (once)")
    create.add_argument("--tenant", required=True, help="tenant the key belongs to (letters, digits, . _ -)")
    create.add_argument("--rpm", type=int, help="the tenant's requests per minute (0: no limit)")
    create.add_argument("--tpm", type=int, help="the tenant's tokens per minute, prompt + max_tokens (0: no limit)")
    create.add_argument("--concurrency", type=int, help="the tenant's requests in flight at once (0: no limit)")
    create.add_argument("--batch-tokens-per-day", type=int,
                        help="tokens of the batches the tenant may create in 24 h, prompt + max_tokens (0: no limit)")
    create.add_argument("--batch-queued-lines", type=int,
                        help="lines of the tenant's batches not answered yet, at most (0: no limit)")
    create.add_argument("--label", help="a note shown by `keys list`")
    create.add_argument("--no-log-prompts", dest="log_prompts", action="store_false", default=None,
                        help="keep the tenant's prompts out of the completions log (no replay by `specstream eval`)")
    create.set_defaults(handler=cmd_create)

    listing = actions.add_parser("list", help="keys (never the keys themselves: ids, tenants, limits)")
    listing.add_argument("--all", action="store_true", help="include revoked keys")
    listing.add_argument("--json", action="store_true", help="JSON output")
    listing.set_defaults(handler=cmd_list)

    revoke = actions.add_parser("revoke", help="revoke a key by id, or every key of a tenant")
    revoke.add_argument("key_id", nargs="?", help="the key's id (from `keys list`; a prefix of 4+ characters will do)")
    revoke.add_argument("--tenant", help="revoke every key of this tenant")
    revoke.set_defaults(handler=cmd_revoke)

    hashing = actions.add_parser("hash", help="print a key's SHA-256 (for edge.auth.key_hashes)")
    hashing.add_argument("key", help="the key, or - to read it from stdin")
    hashing.add_argument("--tenant", help="print the 'tenant:digest' entry")
    hashing.set_defaults(handler=cmd_hash)

    actions.add_parser("path", help="print where the keys file and the local key are").set_defaults(handler=cmd_path)


def _keys_file(args: argparse.Namespace, settings: Any) -> Path:
    configured = getattr(args, "file", None)
    if configured is None and settings is not None:
        configured = settings.edge.auth.keys_file
    return keys_file_path(configured)


def _defaults(settings: Any) -> TenantLimits:
    if settings is None:
        return TenantLimits()
    limits = settings.edge.limits
    return TenantLimits(**limits.model_dump())


def cmd_create(args: argparse.Namespace, settings: Any) -> int:
    path = _keys_file(args, settings)
    try:
        key, record = create_key(path, args.tenant, rpm=args.rpm, tpm=args.tpm, concurrency=args.concurrency,
                                 label=args.label, log_prompts=args.log_prompts,
                                 batch_tokens_per_day=args.batch_tokens_per_day,
                                 batch_queued_lines=args.batch_queued_lines)
        limits = read_key_file(path).limits_for(args.tenant, _defaults(settings))
    except KeyStoreError as error:
        _say(f"keys: error: {error}")
        return 1
    print(key, flush=True)
    _say(f"keys: created key {record.id} for tenant {record.tenant} ({limits.describe()}) in {path}")
    _say("keys: this is the only time the key is shown; store it now")
    return 0


def cmd_list(args: argparse.Namespace, settings: Any) -> int:
    path = _keys_file(args, settings)
    try:
        data = read_key_file(path)
    except KeyStoreError as error:
        _say(f"keys: error: {error}")
        return 1
    records = [k for k in data.keys if args.all or k.active]
    defaults = _defaults(settings)
    if args.json:
        print(json.dumps([
            {"id": k.id, "tenant": k.tenant, "created_at": k.created_at, "revoked_at": k.revoked_at, "label": k.label,
             "limits": vars(data.limits_for(k.tenant, defaults)), "log_prompts": data.log_prompts(k.tenant)}
            for k in records], indent=2))
        return 0
    if not records:
        _say(f"keys: no {'' if args.all else 'active '}keys in {path}")
        return 0
    print(f"{'ID':<10} {'TENANT':<20} {'CREATED':<20} {'STATE':<8} LIMITS")
    for k in records:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(k.created_at))
        state = "active" if k.active else "revoked"
        label = (f"  ({k.label})" if k.label else "") + ("" if data.log_prompts(k.tenant) else "  [prompts not logged]")
        print(f"{k.id:<10} {k.tenant:<20} {created:<20} {state:<8} {data.limits_for(k.tenant, defaults).describe()}{label}")
    return 0


def cmd_revoke(args: argparse.Namespace, settings: Any) -> int:
    path = _keys_file(args, settings)
    if (args.key_id is None) == (args.tenant is None):
        _say("keys: error: give a key id or --tenant NAME")
        return 2
    try:
        revoked = revoke_keys(path, key_id=args.key_id, tenant=args.tenant)
    except KeyStoreError as error:
        _say(f"keys: error: {error}")
        return 1
    for k in revoked:
        _say(f"keys: revoked key {k.id} of tenant {k.tenant}")
    return 0


def cmd_hash(args: argparse.Namespace, settings: Any) -> int:
    key = sys.stdin.readline().strip() if args.key == "-" else args.key
    if not key:
        _say("keys: error: no key given")
        return 2
    digest = hash_key(key)
    print(f"{args.tenant}:{digest}" if args.tenant else digest)
    return 0


def cmd_path(args: argparse.Namespace, settings: Any) -> int:
    path = _keys_file(args, settings)
    print(f"keys file  {path}")
    print(f"local key  {local_key_path(path)}")
    return 0


# --- specstream up --------------------------------------------------------------------------------------------------


def prepare_up(settings: Any, say: Callable[[str], None] = _say) -> Path | None:
    """What `specstream up` does about auth before starting the edge. Returns the local key's file, or None (auth off)."""
    if not settings.edge.auth.enabled:
        exposed = settings.edge.host not in ("127.0.0.1", "localhost", "::1")
        bar = "!" * 78
        for line in (
            bar,
            "!! WARNING: API keys are OFF (edge.auth.enabled: false).",
            f"!! Anyone who can reach http://{settings.edge.host}:{settings.edge.port} may generate on this machine,",
            "!! without limits per tenant. Turn auth back on unless this is a closed test setup.",
            *(["!! The edge listens on a non-loopback address: it is reachable from the network."] if exposed else []),
            bar,
        ):
            say(line)
        return None
    path = keys_file_path(settings.edge.auth.keys_file)
    try:
        local = ensure_local_key(path)
    except KeyStoreError as error:
        from streams.config import ConfigError

        raise ConfigError(f"cannot prepare the local API key: {error}") from None
    if local.created:
        say(f"auth: created an API key for tenant 'local': {local.path} (keys file {path})")
    else:
        say(f"auth: API key in {local.path}")
    return local.path


def curl_auth(key_file: Path | None) -> str:
    """The curl option that sends the local key (empty when auth is off)."""
    return f"-H \"Authorization: Bearer $(cat {key_file})\" " if key_file is not None else ""


def main(argv: list[str] | None = None) -> int:
    """Stand-alone: ``python -m streams.commands.keys [--config FILE] [--file PATH] ACTION ...``."""
    from streams.config import ConfigError, load_settings

    parser = argparse.ArgumentParser(prog="specstream keys", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", metavar="FILE", help="YAML configuration file")
    _add_actions(parser)
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
    except ConfigError as error:
        _say(f"config error: {error}")
        return 2
    handler: Handler = args.handler
    return handler(args, settings)


if __name__ == "__main__":
    sys.exit(main())
