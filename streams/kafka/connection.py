"""How every specstream client connects to Kafka: the one place that turns ``kafka.*`` settings into client options.

Every producer, consumer and admin client of every service (edge, worker, the
CLI's ``send``, ``dlq``, ``topics``, ``bench --backend kafka``) is built with
:func:`client_options`, and FastStream's ``KafkaBroker`` with
:func:`faststream_options`, so TLS and SASL settings cannot differ between them.

A plain ``"host:port"`` string is accepted wherever settings are, meaning an open
(PLAINTEXT) broker: tests and tools that only know an address keep working.

:func:`check_connection` opens one connection at start and turns what goes wrong
(wrong password, untrusted certificate, wrong protocol) into a
:class:`KafkaAccessError` whose message is one line naming the setting to fix,
instead of aiokafka's "Unable to bootstrap" after a retry loop.
"""
from __future__ import annotations

import asyncio
import importlib
import ssl
from functools import lru_cache
from typing import Any

from aiokafka.abc import AbstractTokenProvider
from aiokafka.conn import create_conn
from aiokafka.errors import KafkaConnectionError, KafkaError, SaslAuthenticationFailed
from aiokafka.helpers import create_ssl_context

from streams.config import KafkaSettings

Connectable = KafkaSettings | str
_CHECK_TIMEOUT_S = 15.0


class KafkaAccessError(KafkaError):
    """Kafka refused this client (credentials, certificates, permissions): retrying cannot help."""


def not_authorized(*what: str) -> str:
    """The one-line error for missing ACLs, e.g. ``not_authorized("WRITE topic specstream.replies.*")``."""
    return f"kafka: not authorized to {', '.join(what)} — grant {'them' if len(what) > 1 else 'it'} with " \
           "`specstream kafka acls --apply`"


def settings_of(kafka: Connectable) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=kafka) if isinstance(kafka, str) else kafka


def servers(kafka: Connectable) -> list[str]:
    """The bootstrap addresses as a list (FastStream would take a comma-separated string as one host name)."""
    return [server.strip() for server in settings_of(kafka).bootstrap_servers.split(",") if server.strip()]


def client_options(kafka: Connectable) -> dict[str, Any]:
    """``bootstrap_servers`` and the security keyword arguments of ``AIOKafkaProducer``/``Consumer``/``AdminClient``."""
    settings = settings_of(kafka)
    return {"bootstrap_servers": settings.bootstrap_servers, **security_options(settings)}


def security_options(kafka: KafkaSettings) -> dict[str, Any]:
    """The TLS and SASL keyword arguments alone (what ``aiokafka.conn.create_conn`` takes too)."""
    options: dict[str, Any] = {"security_protocol": kafka.security_protocol}
    if kafka.uses_tls:
        options["ssl_context"] = ssl_context(kafka)
    if kafka.uses_sasl:
        options["sasl_mechanism"] = kafka.sasl_mechanism
        if kafka.sasl_mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = token_provider(kafka)
        else:
            options["sasl_plain_username"] = kafka.sasl_username
            options["sasl_plain_password"] = _password(kafka)
    return options


def _password(kafka: KafkaSettings) -> str | None:
    # The only place the secret leaves its SecretStr: straight into a client's keyword arguments.
    return kafka.sasl_password.get_secret_value() if kafka.sasl_password is not None else None


def faststream_options(kafka: Connectable) -> dict[str, Any]:
    """``KafkaBroker`` keyword arguments: the addresses, FastStream's ``security`` object and the token provider."""
    from faststream.security import BaseSecurity, SASLOAuthBearer, SASLPlaintext, SASLScram256, SASLScram512

    settings = settings_of(kafka)
    options: dict[str, Any] = {"bootstrap_servers": servers(settings)}
    context = ssl_context(settings) if settings.uses_tls else None
    use_ssl = settings.uses_tls
    security: BaseSecurity | None = None
    mechanism = settings.sasl_mechanism if settings.uses_sasl else None
    if mechanism == "OAUTHBEARER":
        security = SASLOAuthBearer(ssl_context=context, use_ssl=use_ssl)
        options["sasl_oauth_token_provider"] = token_provider(settings)
    elif mechanism is not None:
        kind = {"PLAIN": SASLPlaintext, "SCRAM-SHA-256": SASLScram256, "SCRAM-SHA-512": SASLScram512}[mechanism]
        security = kind(username=settings.sasl_username or "", password=_password(settings) or "", ssl_context=context,
                        use_ssl=use_ssl)
    elif use_ssl:
        security = BaseSecurity(ssl_context=context, use_ssl=True)
    if security is not None:
        options["security"] = security
    return options


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext:
    """TLS context: trust ``ssl_cafile`` (else the system's CAs), present ``ssl_certfile`` for mutual TLS."""
    return _ssl_context(kafka.ssl_cafile, kafka.ssl_certfile, kafka.ssl_keyfile, kafka.ssl_check_hostname)


@lru_cache(maxsize=8)
def _ssl_context(cafile: str | None, certfile: str | None, keyfile: str | None, check_hostname: bool) -> ssl.SSLContext:
    # One context per distinct setting: loading a CA bundle costs milliseconds, and services build many clients.
    for key, path in (("kafka.ssl_cafile", cafile), ("kafka.ssl_certfile", certfile), ("kafka.ssl_keyfile", keyfile)):
        if path is not None:
            try:
                with open(path, "rb"):
                    pass
            except OSError as error:
                raise KafkaAccessError(f"kafka: cannot read {key} {path}: {error.strerror or error}") from None
    try:
        context = create_ssl_context(cafile=cafile, certfile=certfile, keyfile=keyfile)
    except ssl.SSLError as error:
        which = "kafka.ssl_certfile / kafka.ssl_keyfile" if certfile else "kafka.ssl_cafile"
        raise KafkaAccessError(f"kafka: {which} is not valid PEM ({error.reason or error})") from None
    context.check_hostname = check_hostname
    return context


def token_provider(kafka: KafkaSettings) -> AbstractTokenProvider:
    """The OAUTHBEARER token provider named by ``kafka.sasl_oauth_token_provider`` ('module:name')."""
    spec = kafka.sasl_oauth_token_provider or ""
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as error:
        raise KafkaAccessError(f"kafka.sasl_oauth_token_provider: cannot import {spec}: {error}") from None
    provider = target() if callable(target) and not isinstance(target, AbstractTokenProvider) else target
    if not isinstance(provider, AbstractTokenProvider):
        raise KafkaAccessError(
            f"kafka.sasl_oauth_token_provider: {spec} gave {type(provider).__name__}, not an aiokafka AbstractTokenProvider")
    return provider


# --- the start-up check --------------------------------------------------------------------------------------------


async def check_connection(kafka: Connectable) -> None:
    """Connect to the first bootstrap server that answers and authenticate, or raise a one-line error.

    :class:`KafkaAccessError` for what retrying cannot fix (credentials, certificates, protocol mismatch);
    ``KafkaConnectionError`` when no broker answers at all.
    """
    settings = settings_of(kafka)
    options = security_options(settings)
    unreachable: list[str] = []
    for server in servers(settings):
        host, _, port = server.rpartition(":")
        try:
            conn = await asyncio.wait_for(
                create_conn(host.strip("[]"), int(port), request_timeout_ms=int(_CHECK_TIMEOUT_S * 1000), **options),
                timeout=_CHECK_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, KafkaConnectionError) as error:
            if isinstance(error, ssl.SSLError) or _closed_in_handshake(error):
                raise KafkaAccessError(explain(error, settings, server)) from None
            unreachable.append(explain(error, settings, server))
            continue
        except SaslAuthenticationFailed as error:
            raise KafkaAccessError(explain(error, settings, server)) from None
        conn.close()
        return
    raise KafkaConnectionError(f"cannot reach Kafka at {settings.bootstrap_servers}: {'; '.join(unreachable)}")


def _closed_in_handshake(error: BaseException) -> bool:
    # A TLS or SASL listener hangs up on a client speaking the wrong protocol.
    return isinstance(error, ConnectionResetError) or (
        isinstance(error, KafkaConnectionError) and "closed" in str(error).lower())


def explain(error: BaseException, kafka: KafkaSettings, server: str) -> str:
    """One line naming what to fix for an error connecting to ``server``."""
    if isinstance(error, SaslAuthenticationFailed):
        return (f"kafka: authentication failed for user {kafka.sasl_username} with {kafka.sasl_mechanism} at {server}"
                " (kafka.sasl_username / kafka.sasl_password)")
    if isinstance(error, ssl.SSLCertVerificationError):
        reason = error.verify_message or error.reason or str(error)
        if "hostname" in reason.lower() or "ip address mismatch" in reason.lower():
            return (f"kafka: the certificate of {server} does not name that host ({reason}); "
                    "connect by a name it carries (kafka.bootstrap_servers) or set kafka.ssl_check_hostname: false")
        cafile = kafka.ssl_cafile or "the system's CA bundle"
        return f"kafka: the certificate of {server} is not trusted by {cafile} ({reason}) (kafka.ssl_cafile)"
    if isinstance(error, ssl.SSLError):
        return (f"kafka: TLS handshake with {server} failed ({error.reason or error}); is it a TLS listener? "
                f"(kafka.security_protocol {kafka.security_protocol})")
    if _closed_in_handshake(error):
        return (f"kafka: {server} closed the connection during the handshake; does its listener speak "
                f"kafka.security_protocol {kafka.security_protocol}?")
    if isinstance(error, asyncio.TimeoutError):
        return "timed out"
    return str(error.args[0] if isinstance(error, KafkaError) and error.args else error) or type(error).__name__
