"""The gateway process (``tributary-gateway``, :mod:`gateway.server.main`): the public Gateway
gRPC service, stateless, any number behind a load balancer.

Requests come in through :mod:`~gateway.server.servicer` (translation only, with
:mod:`~gateway.server.serde`), are served by one handler each (:mod:`~gateway.server.produce`,
:mod:`~gateway.server.fetch`, :mod:`~gateway.server.offsets`; admin, group and metadata calls are
forwarded to the coordinators by :mod:`~gateway.server.admin_forwarder`), and reach the partition
leaders through :mod:`~gateway.server.routing`, which follows the coordinator's metadata watch.
"""
