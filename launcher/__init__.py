"""Runtime code that starts Tributary processes on one machine: the local cluster launcher.

``tributary cluster up`` (the CLI), the integration tests and the benchmarks all start clusters
through it, so they use the launch path users do. :mod:`launcher.processes` starts, watches and
stops one service process; :mod:`launcher.local_cluster` brings up a whole cluster (an embedded
etcd, coordinators, storage nodes, gateways) and re-attaches to one that is running.

Manifests and scripts for real deployments live in ``deploy/``, which is not a package.
"""
