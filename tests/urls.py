"""Store URLs as tests rewrite them: another user, whatever the URL's form."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def with_user(url: str, userinfo: str) -> str:
    """``url`` with its ``user[:password]`` replaced by ``userinfo`` (a host, or a socket directory, kept).

    :param url: a PostgreSQL URL, with a host or a ``?host=/dir`` socket directory.
    :param userinfo: ``user`` or ``user:password``, as it goes before the ``@``.
    :returns: the URL with that user; its path and query kept, any fragment dropped.
    """
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"{userinfo}@{parts.netloc.rpartition('@')[2]}", parts.path, parts.query, ""))
