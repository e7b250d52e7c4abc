"""The gateway, Tributary's public front door, and the clients that talk to it.

* :mod:`gateway.server` -- the gateway process (``tributary-gateway``): the public Gateway gRPC
  service, routing each request to the partition leaders among the storage nodes. Stateless.
* :mod:`gateway.client` -- the Python SDK (Producer, Consumer, Admin); it talks to gateways only.
* :mod:`gateway.cli` -- the ``tributary`` command line, built on the SDK.

The SDK and the CLI import no server module (``tests/unit/test_import_boundaries.py``): what they
share with the server is in ``services/``.
"""
