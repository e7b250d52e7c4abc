"""Kafka's ListOffsets timestamps: which offset of a partition a lookup asks for. Pure.

A lookup is one integer, as in Kafka's ``ListOffsets`` and Spark's Kafka source offset JSON:

* :data:`EARLIEST` (-2): the log start offset;
* :data:`LATEST` (-1): the offset the next committed record will get (the high watermark);
* a timestamp in ms (>= 0): the first offset whose record timestamp is at or after it.

Any other negative number is not a lookup. On the wire it is an ``OffsetSpec`` (earliest, latest
or a timestamp); the conversions are :func:`services.serde.offset_spec_from_proto` (strict: a
bad spec is INVALID_REQUEST) and :func:`services.serde.offset_spec_to_proto`.
"""

from __future__ import annotations

from typing import Final

#: The log start offset.
EARLIEST: Final = -2
#: The high watermark: the offset the next committed record will get.
LATEST: Final = -1
