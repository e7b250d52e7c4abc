"""Consumer groups in the active controller: membership, server-side assignment, committed offsets.

Pure: :mod:`.model` (values), :mod:`.rules` (request validation), :mod:`.assignors` (assignment
strategies), :mod:`.state` (the group state machine), :mod:`.keys` (etcd layout, the writes a
state change needs, loading), :mod:`.offsets` (commit checks, retention).

I/O, per controller term: :mod:`.manager` (lifecycle, membership, watches), :mod:`.store`
(entries, locks, fenced writes, reloads), :mod:`.commits` (batched commits), :mod:`.admin`
(reads, lag, reset, delete, retention), :mod:`.lag` (log offsets from storage nodes),
:mod:`.tasks` (owned tasks). The RPC edge: :mod:`.handlers` and :mod:`.serde`.
"""
