"""Who is calling: the client id of a call (``tributary-client-id`` metadata), logged once per
client and peer so the gateway's log says which applications connect from where."""

from __future__ import annotations

import logging

from services.client_id import client_id_from_metadata

log = logging.getLogger(__name__)

#: Distinct (client id, peer) pairs remembered; past it the memory starts over (each pair may
#: then be logged once more), so a storm of one-off clients cannot grow it without bound.
MAX_REMEMBERED = 10_000


def client_id_of(context) -> str:
    return client_id_from_metadata(context.invocation_metadata())


class ClientLog:
    """Logs the first call of each (client id, peer) pair at INFO."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._max = max_remembered

    def seen(self, context, method: str) -> str:
        """The call's client id ("" when it sends none), logging the pair when it is new."""
        client_id = client_id_of(context)
        pair = (client_id, context.peer())
        if pair not in self._seen:
            if len(self._seen) >= self._max:
                self._seen.clear()
            self._seen.add(pair)
            log.info(
                "client %r connected from %s (first call: %s)", client_id or "(no client id)", pair[1], method
            )
        return client_id
