"""URIs shown to people: a store's URL in a message, a log or a record never carries its password; a tracking
server's address for links."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

HIDDEN = "***"
SECRET_PARAMETERS = {"password", "passwd", "pwd", "secret", "token", "access_token"}
# MLflow 3.17 decides the experiment page's view (GenAI traces or model-training runs) from the browser's stored
# toggle, not from the kind tag, unless the URL names it: every link this project prints names it.
TRAINING_VIEW = "workflowType=machine_learning"


def without_password(uri: str) -> str:
    """uri with the password of its user (scheme://user:password@host) and the values of its secret query
    parameters (?password=...) replaced by ***; anything else, a path or a plain name, unchanged."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # not a URL after all (an unbalanced IPv6 bracket): show nothing of its user part
        return uri.split("@")[-1] if "@" in uri else uri
    netloc, query = parts.netloc, parts.query
    userinfo, at, host = netloc.rpartition("@")  # a password may hold an unescaped @: the host follows the last
    if at and ":" in userinfo:
        netloc = f"{userinfo.split(':', 1)[0]}:{HIDDEN}@{host}"
    pairs = parse_qsl(query, keep_blank_values=True)
    if any(key.lower() in SECRET_PARAMETERS for key, _ in pairs):
        query = "&".join(
            f"{quote(key)}={HIDDEN if key.lower() in SECRET_PARAMETERS else quote(value)}" for key, value in pairs
        )
    if (netloc, query) == (parts.netloc, parts.query):
        return uri  # rebuilding could change it (sqlite:///x.db would lose a slash)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def passwords_of(uri: str) -> list[str]:
    """The secrets without_password hides, as written and decoded: what a driver's message must not repeat."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return []
    found = []
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        found.append(userinfo.split(":", 1)[1])
    found += [value for key, value in parse_qsl(parts.query) if key.lower() in SECRET_PARAMETERS]
    return sorted({s for secret in found for s in (secret, unquote(secret)) if secret}, key=len, reverse=True)


def scrub(text: str, uri: str) -> str:
    """text with every secret of uri in it replaced by ***: each one that stands alone (as a URI, a query or a
    quote writes it), never the letters of a word, so a short password does not turn "port" into "***ort"."""
    for secret in passwords_of(uri):
        text = re.sub(rf"(?<![A-Za-z0-9]){re.escape(secret)}(?![A-Za-z0-9])", HIDDEN, text)
    return text


def tracking_server(uri: str) -> str | None:
    """The address of the MLflow tracking server uri names (scheme://host:port[/prefix], without a user or a
    password, no trailing slash); None for a database, a file store or an empty URI."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https"):
        return None
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path.rstrip("/"), "", ""))
