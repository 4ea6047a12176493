"""TLS for the RLlink TCP listener (Python ``ssl``), built from ``[server]`` settings.

Plain RLlink is unencrypted; a non-loopback bind requires TLS or an explicit
``insecure_remote = true`` (checked in ``daemon.config.validate``). With
``tls_client_ca_file`` the server also requires and verifies client certificates.
"""
from __future__ import annotations

import ssl

from rlinkd.daemon.config import ServerConfig
from rlinkd.daemon.errors import ConfigError


def server_context(srv: ServerConfig) -> ssl.SSLContext | None:
    """A server SSLContext, or None when TLS is not configured. ConfigError on bad files."""
    if not srv.tls_cert_file:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(srv.tls_cert_file, srv.tls_key_file)
        if srv.tls_client_ca_file:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(srv.tls_client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"server.tls_*: cannot load certificate/key: {exc}") from None
    return ctx

