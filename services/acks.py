"""``Acks``: what a produce waits for before it is answered (Kafka's ``acks``). Pure.

One enum for every side: the SDK's and Spark's ``acks`` setting (:meth:`Acks.parse`), the
gateway's produce requests and the storage node's appends. Its protobuf form (``tributary.v1.Acks``,
where 0 means "unspecified") is mapped in one place, :func:`services.serde.acks_to_proto` /
:func:`services.serde.acks_from_proto`.
"""

from __future__ import annotations

from enum import IntEnum


class Acks(IntEnum):
    """Kafka's acks values."""

    #: Nothing: the answer does not wait for the log (offsets unknown, failures unseen).
    NONE = 0
    #: The leader wrote the records.
    LEADER = 1
    #: Every in-sync replica has them: the high watermark passed them.
    ALL = -1

    @classmethod
    def parse(cls, value: object) -> Acks:
        """A user's ``acks`` setting: 0, 1, -1 or ``"all"`` (the numbers also as strings).

        Raises ValueError for anything else.
        """
        try:
            return _SETTINGS[value]
        except (KeyError, TypeError):
            raise ValueError(f"acks must be 0, 1 or 'all' (-1), not {value!r}") from None


_SETTINGS: dict[object, Acks] = {
    0: Acks.NONE,
    1: Acks.LEADER,
    -1: Acks.ALL,
    "all": Acks.ALL,
    "0": Acks.NONE,
    "1": Acks.LEADER,
    "-1": Acks.ALL,
}
