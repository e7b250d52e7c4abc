"""The messaging-client instruments of the semantic conventions, for the Python SDK: messages
sent and consumed, operation durations. Built by :func:`services.telemetry.client_instruments`
on the application's MeterProvider (never one of our own)."""

from __future__ import annotations

import time

from services.telemetry import names

#: messaging.operation.name -> messaging.operation.type for the SDK's operations.
_OPERATION_TYPES = {
    "send": "send",
    "produce": "send",
    "poll": "receive",
    "fetch": "receive",
    "receive": "receive",
    "commit": "settle",
}


class ClientInstruments:
    """The messaging client conventions, for the SDK's producer and consumer (see ``__init__``)."""

    def __init__(self, meter, *, server_address: str = "", server_port: int | None = None) -> None:
        self._set_peer(server_address, server_port)
        self._sent = meter.create_counter(
            names.MESSAGING_CLIENT_SENT_MESSAGES,
            unit="{message}",
            description="Number of messages producer attempted to send to the broker.",
        )
        self._consumed = meter.create_counter(
            names.MESSAGING_CLIENT_CONSUMED_MESSAGES,
            unit="{message}",
            description="Number of messages that were delivered to the application.",
        )
        self._duration = meter.create_histogram(
            names.MESSAGING_CLIENT_OPERATION_DURATION,
            unit="s",
            description="Duration of messaging operation initiated by a producer or consumer client.",
            explicit_bucket_boundaries_advisory=(
                0.005,
                0.01,
                0.025,
                0.05,
                0.075,
                0.1,
                0.25,
                0.5,
                0.75,
                1.0,
                2.5,
                5.0,
                7.5,
                10.0,
            ),
        )
        self._throttle = meter.create_histogram(
            names.CLIENT_THROTTLE_TIME,
            unit="s",
            description="How long the client held its requests to a gateway that throttled it "
            "for going over a client quota (throttle_time_ms, KIP-219).",
        )

    def _set_peer(self, server_address: str, server_port: int | None) -> None:
        self._peer: dict[str, str | int] = {names.SERVER_ADDRESS: server_address} if server_address else {}
        if server_port is not None and server_address:
            self._peer[names.SERVER_PORT] = server_port
        self._attributes: dict[tuple, dict] = {}

    def with_peer(self, server_address: str = "", server_port: int | None = None) -> ClientInstruments:
        """The same instruments, recording another ``server.address``/``server.port``."""
        other = object.__new__(ClientInstruments)
        other._sent, other._consumed, other._duration = self._sent, self._consumed, self._duration
        other._throttle = self._throttle
        other._set_peer(server_address, server_port)
        return other

    def _attrs(
        self, operation: str, topic: str, partition: int | None, group: str | None, error_type: str | None
    ) -> dict:
        key = (operation, topic, partition, group, error_type)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = {
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_NAME: operation,
                names.MESSAGING_DESTINATION_NAME: topic,
                **self._peer,
            }
            if operation in _OPERATION_TYPES:
                attributes[names.MESSAGING_OPERATION_TYPE] = _OPERATION_TYPES[operation]
            if partition is not None:
                attributes[names.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
            if group:
                attributes[names.MESSAGING_CONSUMER_GROUP_NAME] = group
            if error_type:
                attributes[names.ERROR_TYPE] = error_type
            self._attributes[key] = attributes
        return attributes

    def sent(
        self,
        topic: str,
        count: int,
        *,
        partition: int | None = None,
        error_type: str | None = None,
        operation: str = "send",
    ) -> None:
        """``count`` messages of one produce request / batch were sent (or failed: ``error_type``)."""
        self._sent.add(count, self._attrs(operation, topic, partition, None, error_type))

    def consumed(
        self,
        topic: str,
        count: int,
        *,
        partition: int | None = None,
        group: str | None = None,
        operation: str = "poll",
    ) -> None:
        """``count`` messages were delivered to the application (once per delivery)."""
        self._consumed.add(count, self._attrs(operation, topic, partition, group, None))

    def operation_duration(
        self,
        seconds: float,
        *,
        operation: str,
        topic: str,
        partition: int | None = None,
        group: str | None = None,
        error_type: str | None = None,
    ) -> None:
        """How long one send (request until acknowledged) or one poll took."""
        self._duration.record(seconds, self._attrs(operation, topic, partition, group, error_type))

    def throttled(self, seconds: float, *, operation: str) -> None:
        """A gateway's answer asked the client to hold its next requests for ``seconds``."""
        self._throttle.record(seconds, {names.MESSAGING_OPERATION_NAME: operation, **self._peer})

    @staticmethod
    def now() -> float:
        return time.perf_counter()
