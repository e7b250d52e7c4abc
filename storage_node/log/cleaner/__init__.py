"""The log cleaner: compaction of ``cleanup.policy=compact`` partitions (Kafka's LogCleaner).

======================  ==========================================================================
module                  holds
======================  ==========================================================================
``planner``             pure: clean / dirty / uncleanable parts, dirty ratio, due, grouping
``offset_map``          pure: the bounded key -> latest offset map
``batch_filter``        pure: one batch rewritten without the records compaction drops
``throttle``            the I/O throttle shared by the cleaner threads
``swap``                the crash-safe ``.cleaned`` / ``.swap`` replacement of segments
``cleaner``             one round over one partition: map, rewrite, swap, checkpoint
``manager``             ``LogCleaner``: the threads, choosing the dirtiest partition, progress
======================  ==========================================================================
"""
