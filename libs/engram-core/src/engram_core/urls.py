"""A URL as it may be shown: in an error message, a log line, a settings error at start.

A configured URL may carry credentials (``http://user:password@host/v1``,
``nats://user:token@host:4222``) or a key in its query; neither may reach a log or a
terminal. :func:`without_credentials` is what every message names instead.
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def without_credentials(url: str) -> str:
    """``url`` without ``user:password@``, query or fragment (a key may ride there).
    Something that does not parse as a URL is shown as ``<unparseable URL>``."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return "<unparseable URL>"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
