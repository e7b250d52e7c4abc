"""The controller's pure decisions: leader election, transitions, node sync."""

from coordinator.metadata import MetadataState
from coordinator.model import NO_LEADER, PartitionRecord, PartitionStatus, TopicRecord
from coordinator.partition_state import (
    elect_leader,
    plan_node_sync,
    plan_partition,
    plan_partitions,
)

ONLINE, OFFLINE = PartitionStatus.ONLINE, PartitionStatus.OFFLINE


def topic(assignment, name="t", **configs):
    return TopicRecord(name, "id", len(assignment[0]), configs, tuple(tuple(r) for r in assignment))


def record(replicas, leader, epoch, isr, status, mod=7):
    return PartitionRecord(tuple(replicas), leader, epoch, tuple(isr), status, mod)


def test_elect_prefers_assignment_order_among_live_in_sync():
    assert elect_leader([3, 1, 2], isr={1, 2, 3}, live={1, 2}) == 1
    assert elect_leader([3, 1, 2], isr={3}, live={1, 2}) is None
    assert elect_leader([3, 1, 2], isr={3}, live={1, 2}, unclean=True) == 1
    assert elect_leader([3, 1, 2], isr=(), live={2}) == 2  # never led: any live replica


def test_new_partition_pushes_to_live_replicas_leader_first():
    t = topic([[2, 1, 3]])
    transition = plan_partition(t, 0, None, live={1, 2, 3})
    assert transition.push_to == (2, 1, 3) and transition.required == 2
    assert transition.expected_mod_revision == 0
    # every replica asked to create it starts in the ISR (the controller keeps those that did)
    assert transition.record == PartitionRecord((2, 1, 3), 2, 0, (2, 1, 3), ONLINE)


def test_new_partition_with_preferred_leader_down_takes_the_next():
    transition = plan_partition(topic([[2, 1]]), 0, None, live={1})
    assert transition.required == 1 and transition.record.leader == 1


def test_new_partition_without_live_replica_stays_pending():
    assert plan_partition(topic([[2]]), 0, None, live={1}) is None


def test_online_with_live_leader_needs_nothing():
    assert plan_partition(topic([[1]]), 0, record([1], 1, 0, [1], ONLINE), live={1}) is None


def test_a_gone_follower_leaves_the_isr_without_an_epoch_bump():
    current = record([1, 2, 3], 1, 4, [1, 2, 3], ONLINE)
    transition = plan_partition(topic([[1, 2, 3]]), 0, current, live={1, 3})
    assert transition.record == PartitionRecord((1, 2, 3), 1, 4, (1, 3), ONLINE)
    assert transition.push_to == () and transition.required is None
    assert transition.expected_mod_revision == 7


def test_a_follower_that_lost_its_log_leaves_the_isr():
    current = record([1, 2], 1, 4, [1, 2], ONLINE)
    transition = plan_partition(topic([[1, 2]]), 0, current, live={1, 2}, lost={2})
    assert transition.record.isr == (1,)
    assert transition.record.leader_epoch == 4


def test_a_leader_that_lost_its_log_hands_over_to_an_in_sync_replica():
    current = record([1, 2], 1, 4, [1, 2], ONLINE)
    transition = plan_partition(topic([[1, 2]]), 0, current, live={1, 2}, lost={1})
    assert transition.record == PartitionRecord((1, 2), 2, 5, (2,), ONLINE)
    assert transition.must_exist and not transition.unclean


def test_a_sole_in_sync_replica_that_lost_its_log_never_leads_again_cleanly():
    current = record([1], 1, 4, [1], ONLINE)
    transition = plan_partition(topic([[1]]), 0, current, live={1}, lost={1})
    assert transition.record == PartitionRecord((1,), NO_LEADER, 5, (1,), OFFLINE)
    offline = record([1], NO_LEADER, 5, [1], OFFLINE)
    assert plan_partition(topic([[1]]), 0, offline, live={1}, lost={1}) is None


def test_leader_lost_without_other_in_sync_replica_goes_offline_with_bumped_epoch():
    current = record([1, 2], 1, 4, [1], ONLINE)
    transition = plan_partition(topic([[1, 2]]), 0, current, live={2})
    assert transition.push_to == () and transition.required is None
    assert transition.expected_mod_revision == 7
    assert transition.record == PartitionRecord((1, 2), NO_LEADER, 5, (1,), OFFLINE)


def test_leader_lost_moves_to_in_sync_replica_and_shrinks_isr():
    current = record([1, 2, 3], 1, 4, [1, 2, 3], ONLINE)
    transition = plan_partition(topic([[1, 2, 3]]), 0, current, live={2, 3})
    assert transition.required == 2 and transition.push_to == (2,)
    assert transition.record == PartitionRecord((1, 2, 3), 2, 5, (2, 3), ONLINE)


def test_offline_comes_back_when_in_sync_replica_returns():
    current = record([1, 2], NO_LEADER, 5, [1], OFFLINE)
    assert plan_partition(topic([[1, 2]]), 0, current, live={2}) is None
    transition = plan_partition(topic([[1, 2]]), 0, current, live={1, 2})
    assert transition.required == 1
    assert transition.record == PartitionRecord((1, 2), 1, 6, (1,), ONLINE)


def test_unclean_election_config_allows_an_out_of_sync_leader():
    current = record([1, 2], 1, 0, [1], ONLINE)
    t = topic([[1, 2]], **{"unclean.leader.election.enable": "true"})
    transition = plan_partition(t, 0, current, live={2})
    assert transition.record == PartitionRecord((1, 2), 2, 1, (2,), ONLINE)
    assert transition.unclean and not transition.must_exist


def test_clean_elections_must_find_the_log_in_place():
    current = record([1, 2], 1, 0, [1, 2], ONLINE)
    transition = plan_partition(topic([[1, 2]]), 0, current, live={2})
    assert transition.must_exist and not transition.unclean


def test_unclean_election_may_give_a_lost_sole_replica_an_empty_log():
    t = topic([[1]], **{"unclean.leader.election.enable": "true"})
    offline = record([1], NO_LEADER, 5, [1], OFFLINE)
    transition = plan_partition(t, 0, offline, live={1}, lost={1})
    assert transition.record.leader == 1 and transition.unclean and not transition.must_exist


def state_with(topics, partitions=(), brokers=()):
    state = MetadataState()
    state.topics = {t.name: t for t in topics}
    for name, p, rec in partitions:
        state.partitions.setdefault(name, {})[p] = rec
    from coordinator.model import RegisteredBroker

    state.brokers = {b: RegisteredBroker(b, "h", 1, 2) for b in brokers}
    return state


def test_plan_partitions_skips_topics_being_deleted():
    keep = topic([[1], [2]], name="keep")
    gone = TopicRecord("gone", "id", 1, {}, ((1,),), deleting=True)
    transitions = plan_partitions(state_with([keep, gone], brokers=[1, 2]))
    assert sorted((t.topic, t.partition) for t in transitions) == [("keep", 0), ("keep", 1)]


def test_plan_partitions_limited_to_named_topics():
    a, b = topic([[1], [2]], name="a"), topic([[1]], name="b")
    state = state_with([a, b], brokers=[1, 2])
    assert {t.topic for t in plan_partitions(state, topics={"b", "unknown"})} == {"b"}
    assert plan_partitions(state, topics=set()) == []
    assert len(plan_partitions(state, topics=None)) == 3


def test_node_sync_creates_assigned_and_deletes_orphans():
    a = topic([[1, 2], [2, 3]], name="a")
    gone = TopicRecord("gone", "id", 1, {}, ((1,),), deleting=True)
    state = state_with([a, gone], brokers=[1, 2, 3])
    local = [("a", 0), ("a", 1), ("gone", 0), ("unknown", 4), ("a", 9)]
    plan = plan_node_sync(state, 2, local)
    assert plan.create == (("a", 0), ("a", 1))
    assert plan.delete == (("a", 9), ("gone", 0), ("unknown", 4))
    plan1 = plan_node_sync(state, 1, local)
    assert plan1.create == (("a", 0),) and ("a", 1) in plan1.delete


# -- controlled shutdown ---------------------------------------------------------------------------


def test_a_stopping_leader_hands_over_to_the_first_other_in_sync_replica():
    current = record([2, 3, 1], 2, 4, [2, 3, 1], ONLINE)
    transition = plan_partition(topic([[2, 3, 1]]), 0, current, live={1, 2, 3}, shutting_down={2})
    # Kafka's ControlledShutdown election: the ISR minus the stopping node, epoch bumped
    assert transition.record == PartitionRecord((2, 3, 1), 3, 5, (3, 1), ONLINE)
    assert transition.push_to == (3,) and transition.required == 3
    assert transition.must_exist and not transition.unclean
    assert transition.expected_mod_revision == 7


def test_a_stopping_leader_skips_replicas_out_of_sync_gone_or_stopping_too():
    current = record([1, 2, 3, 4], 1, 0, [1, 3, 4], ONLINE)
    # 2 is live but out of sync, 3 is stopping as well: 4 takes over
    transition = plan_partition(topic([[1, 2, 3, 4]]), 0, current, live={1, 2, 3, 4}, shutting_down={1, 3})
    assert transition.record.leader == 4 and transition.record.isr == (4,)
    assert transition.record.leader_epoch == 1


def test_a_stopping_sole_in_sync_replica_keeps_leading():
    rf1 = record([1], 1, 3, [1], ONLINE)
    assert plan_partition(topic([[1]]), 0, rf1, live={1}, shutting_down={1}) is None
    # an out-of-sync live follower never takes over in a controlled shutdown (no data loss)
    alone = record([1, 2], 1, 3, [1], ONLINE)
    assert plan_partition(topic([[1, 2]]), 0, alone, live={1, 2}, shutting_down={1}) is None


def test_a_stopping_follower_leaves_the_isr_without_an_epoch_bump():
    current = record([1, 2, 3], 1, 4, [1, 2, 3], ONLINE)
    transition = plan_partition(topic([[1, 2, 3]]), 0, current, live={1, 2, 3}, shutting_down={2})
    assert transition.record == PartitionRecord((1, 2, 3), 1, 4, (1, 3), ONLINE)
    assert transition.push_to == ()


def test_a_stopping_node_is_not_elected_when_a_leader_is_lost():
    current = record([1, 2, 3], 1, 4, [1, 2, 3], ONLINE)
    transition = plan_partition(topic([[1, 2, 3]]), 0, current, live={2, 3}, shutting_down={2})
    assert transition.record.leader == 3 and transition.record.isr == (3,)


def test_shutdown_progress_lists_what_is_left_to_move_and_what_stays():
    from coordinator.partition_state import shutdown_progress

    t = topic([[1, 2], [2, 1], [1], [1, 2]], name="t")
    state = state_with(
        [t],
        brokers=[1, 2],
        partitions=[
            ("t", 0, record([1, 2], 1, 0, [1, 2], ONLINE)),  # leads, 2 in sync: to move
            ("t", 1, record([2, 1], 2, 0, [2, 1], ONLINE)),  # follows 2: to leave the ISR
            ("t", 2, record([1], 1, 0, [1], ONLINE)),  # RF 1: kept
            ("t", 3, record([1, 2], 1, 0, [1], ONLINE)),  # 2 out of sync: kept
        ],
    )
    assert shutdown_progress(state, 1, {1}) == ([("t", 0), ("t", 1)], [("t", 2), ("t", 3)])
    # once the moves are written, only the kept ones are left
    for p in (0, 1):
        state.partitions["t"][p] = record([1, 2] if p == 0 else [2, 1], 2, 1, [2], ONLINE)
    assert shutdown_progress(state, 1, {1}) == ([], [("t", 2), ("t", 3)])
    # its leader stopping as well, a follower's membership is left to that leader's own shutdown
    state.partitions["t"][1] = record([2, 1], 2, 0, [2, 1], ONLINE)
    assert shutdown_progress(state, 1, {1, 2}) == ([], [("t", 2), ("t", 3)])


def test_plan_partitions_moves_everything_off_a_stopping_node():
    t = topic([[1, 2, 3], [2, 3, 1], [3, 1, 2]], name="t")
    state = state_with(
        [t],
        brokers=[1, 2, 3],
        partitions=[
            ("t", p, record(t.assignment[p], t.assignment[p][0], 0, t.assignment[p], ONLINE))
            for p in range(3)
        ],
    )
    transitions = {x.partition: x.record for x in plan_partitions(state, shutting_down={1})}
    assert transitions[0].leader == 2 and transitions[0].leader_epoch == 1
    assert all(1 not in r.isr for r in transitions.values())
    assert transitions[1].leader == 2 and transitions[1].leader_epoch == 0  # follower: no bump
    assert transitions[2].leader == 3 and transitions[2].leader_epoch == 0


# -- preferred leader election ---------------------------------------------------------------------


def test_preferred_leader_election_moves_leadership_back_to_the_first_replica():
    from coordinator.partition_state import plan_preferred_leader

    current = record([1, 2, 3], 2, 6, [2, 3, 1], ONLINE)
    transition = plan_preferred_leader(topic([[1, 2, 3]]), 0, current, live={1, 2, 3})
    assert transition.record == PartitionRecord((1, 2, 3), 1, 7, (2, 3, 1), ONLINE)
    assert transition.push_to == (1,) and transition.required == 1 and transition.must_exist


def test_preferred_leader_election_says_why_not():
    from coordinator.partition_state import plan_preferred_leader
    from services import errors

    t = topic([[1, 2, 3]])
    led = record([1, 2, 3], 1, 6, [1, 2, 3], ONLINE)
    assert isinstance(plan_preferred_leader(t, 0, led, live={1, 2, 3}), errors.ElectionNotNeededError)
    out_of_sync = record([1, 2, 3], 2, 6, [2, 3], ONLINE)
    for current, live, kwargs in (
        (out_of_sync, {1, 2, 3}, {}),  # never a replica that could lose records
        (record([1, 2, 3], 2, 6, [2, 3, 1], ONLINE), {2, 3}, {}),  # not live
        (record([1, 2, 3], 2, 6, [2, 3, 1], ONLINE), {1, 2, 3}, {"shutting_down": {1}}),
        (record([1, 2, 3], 2, 6, [2, 3, 1], ONLINE), {1, 2, 3}, {"lost": {1}}),
        (record([1, 2, 3], NO_LEADER, 6, [1], OFFLINE), {2, 3}, {}),
        (None, {1, 2, 3}, {}),
    ):
        outcome = plan_preferred_leader(t, 0, current, live=live, **kwargs)
        assert isinstance(outcome, errors.PreferredLeaderNotAvailableError), (current, live, kwargs)
        assert outcome.retriable


def test_election_targets_expand_topics_and_default_to_everything():
    from coordinator.partition_state import election_targets

    a, b = topic([[1], [2]], name="a"), topic([[1]], name="b")
    gone = TopicRecord("gone", "id", 1, {}, ((1,),), deleting=True)
    state = state_with([a, b, gone], brokers=[1, 2])
    assert election_targets(state, [], []) == [("a", 0), ("a", 1), ("b", 0)]
    assert election_targets(state, ["a"], [("b", 0), ("a", 1)]) == [("b", 0), ("a", 1), ("a", 0)]
    assert election_targets(state, ["nope"], [("b", 5)]) == [("b", 5), ("nope", -1)]
