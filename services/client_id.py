"""The client id every SDK call carries in its gRPC metadata (Kafka's ``client.id``).

Kafka puts ``client.id`` in every request header, so brokers can log it and operators can tell
applications apart. gRPC has call metadata for that: the SDK sends ``tributary-client-id`` on
every call, and so can a client in any language. The gateway logs each client once per peer and
fills a JoinGroup's empty ``client_id`` from it, which ``tributary groups describe`` shows.
"""

from __future__ import annotations

#: The metadata key (gRPC keys are lower case ASCII).
CLIENT_ID_METADATA_KEY = "tributary-client-id"
#: Longer ids are cut to this many characters (metadata is bounded; ids are labels).
MAX_CLIENT_ID_LENGTH = 255


def client_id_from_metadata(metadata) -> str:
    """The client id in ``metadata`` (pairs, as ``context.invocation_metadata()`` gives), or ""."""
    for key, value in metadata or ():
        if key == CLIENT_ID_METADATA_KEY:
            text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
            return text[:MAX_CLIENT_ID_LENGTH]
    return ""
