"""The transaction coordinator in the active controller: producer ids, transactions, markers.

Pure: :mod:`.model` (values), :mod:`.state` (the state machine and request rules), :mod:`.keys`
(etcd layout and values).

I/O, per controller term: :mod:`.producer_ids` (id blocks from etcd's counter), :mod:`.store`
(entries, locks, fenced compare-and-swap writes), :mod:`.markers` (COMMIT / ABORT markers to
partition leaders, batched per node), :mod:`.manager` (the RPCs, completion, failover, timeouts,
expiration). The RPC edge: :mod:`.handlers` and :mod:`.serde`. The group side of transactional
offsets is :mod:`coordinator.groups.txn_offsets`.
"""
