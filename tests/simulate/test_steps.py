"""The reduced step model: Gloo's coordination chain, ring hops, local steps, timeouts."""

from dataclasses import replace

import numpy as np
import pytest

from globaldl.fleet.profiles import LinkProfile
from globaldl.simulate.collectives import (
    RingStage,
    Segments,
    chain_cycle,
    chain_sends,
    collective_of,
    coordination_of,
    ring_allgather_word,
    ring_finish,
    ring_segments,
    totals_allreduce_of,
)
from globaldl.simulate.exchange import (
    BBR_STARTUP_GAIN,
    SEGMENT_BYTES,
    ExchangeMode,
    ExchangeParameters,
    Hops,
    allreduce_filled_segments,
    allreduce_hop_traffic,
    allreduce_segments,
    paced_seconds,
    plan_network,
    ring_messages,
)
from globaldl.simulate.platform import Device, Fleet, Site, link_directions, uniform_fleet
from globaldl.simulate.steps import EPOCH_TOTALS_BYTES, Workload, _epoch_ends, simulate_steps
from globaldl.simulate.topology import Phase

RNG = np.random.default_rng(0)


def _ring(ranks, transfer=0.0, latency=0.1, jitter=0.0, notify=0.0):
    upstream = np.roll(np.arange(ranks), -1)
    return RingStage(
        upstream,
        np.full(ranks, transfer),
        np.full(ranks, latency),
        np.full(ranks, jitter),
        np.full(ranks, 2 * (ranks - 1)),
        np.full(ranks, notify),
    )


def test_the_coordination_word_crosses_the_ring_twice_one_message_at_a_time():
    # Gloo fills one of 2N segments with an 8-byte word: 2(N-1) single messages in a row.
    ranks, hop = 10, 0.065
    done, longest_wait = chain_cycle(
        np.zeros(ranks), np.full(ranks, hop), np.zeros(ranks), np.zeros(ranks)
    )
    assert done.max() == pytest.approx(2 * (ranks - 1) * hop)
    # The longest single wait is about N hops (rank N-1 waits for the word to come round),
    # not the whole chain: this, not 2(N-1) hops, is what meets Gloo's timeout.
    assert longest_wait == pytest.approx(ranks * hop)
    assert chain_sends(ranks).sum() == 2 * (ranks - 1)


def test_a_rank_entering_late_holds_the_chain_up():
    entry = np.zeros(4)
    entry[2] = 1.0
    done, _ = chain_cycle(entry, np.full(4, 0.1), np.zeros(4), np.zeros(4))
    # Reduce-scatter runs 3 -> 2 -> 1 -> 0. Rank 3's word waits for rank 2 to post its
    # receive at 1.0 (Gloo sends nothing to a rank not ready for it): rank 2 has it at 1.1,
    # rank 0 at 1.3.
    assert done[0] == pytest.approx(1.3)
    assert done[1] == pytest.approx(1.3 + 3 * 0.1)


def test_only_the_chains_first_message_waits_for_its_receivers_ready():
    # Gloo's rendezvous: rank N-2 posts its receive on entry, and rank N-1 hears of it one
    # return latency later; every later receiver posted long before the word comes by.
    ranks, hop = 10, 0.065
    done, _ = chain_cycle(
        np.zeros(ranks), np.full(ranks, hop), np.zeros(ranks), np.full(ranks, hop)
    )
    assert done.max() == pytest.approx((2 * (ranks - 1) + 1) * hop)


def test_a_late_receiver_holds_its_sender_for_the_notification():
    entry = np.zeros(4)
    entry[1] = 1.0
    done, longest = chain_cycle(entry, np.full(4, 0.1), np.zeros(4), np.full(4, 0.1))
    # Rank 2 has the word at 0.2 but rank 1's receive reaches it only at 1.1: rank 1 has it
    # at 1.2, rank 0 at 1.3, and the gather's three hops follow.
    assert done[0] == pytest.approx(1.3)
    assert done[1] == pytest.approx(1.3 + 3 * 0.1)
    # Rank 3 waits longest: done with its part at 0, it has the result at 1.4.
    assert longest == pytest.approx(1.4)


def test_ring_of_equal_hops_takes_hops_times_one_hop():
    finish, longest = ring_finish(np.zeros(4), _ring(4), np.zeros(4), RNG)
    np.testing.assert_allclose(finish, 6 * 0.1)
    assert longest == pytest.approx(0.1)


def test_every_ring_hop_pays_the_receivers_ready_and_the_message():
    # A hop posts its receive when it starts: the sender hears of it one latency later, and
    # the bytes take another. Two one-way latencies per hop, as Gloo's TCP pairs do.
    finish, longest = ring_finish(np.zeros(4), _ring(4, notify=0.1), np.zeros(4), RNG)
    np.testing.assert_allclose(finish, 6 * 0.2)
    assert longest == pytest.approx(0.2)


def test_two_messages_in_flight_share_a_latency_bound_rings_round_trips():
    # Gloo's allreduce posts segment k's receive and send once segment k-2's are done: the
    # notification and the message of two segments travel together, one round trip per pair.
    pipelined = replace(_ring(4, notify=0.1), in_flight=2)
    finish, longest = ring_finish(np.zeros(4), pipelined, np.zeros(4), RNG)
    np.testing.assert_allclose(finish, 6 / 2 * 0.2)
    one_at_a_time, _ = ring_finish(np.zeros(4), _ring(4, notify=0.1), np.zeros(4), RNG)
    np.testing.assert_allclose(one_at_a_time, 6 * 0.2)
    assert longest == pytest.approx(0.2)


def test_two_messages_in_flight_gain_nothing_on_a_bandwidth_bound_ring():
    # The bytes of one connection leave one after the other either way.
    stage = _ring(4, transfer=0.1, latency=0.0)
    pipelined, _ = ring_finish(np.zeros(4), replace(stage, in_flight=2), np.zeros(4), RNG)
    one_at_a_time, _ = ring_finish(np.zeros(4), stage, np.zeros(4), RNG)
    np.testing.assert_allclose(pipelined, 6 * 0.1)
    np.testing.assert_allclose(one_at_a_time, 6 * 0.1)


def test_a_ring_stage_refuses_no_message_in_flight():
    with pytest.raises(ValueError, match="in_flight must be an integer >= 1, got 0"):
        replace(_ring(4), in_flight=0)


@pytest.mark.parametrize(
    ("payload_bytes", "ranks", "segments"),
    [
        (246_828, 4, 2),  # LeNet: 8 segments of 30.9 kB
        (8 * 2**20, 4, 2),  # exactly 1 MiB per segment
        (8 * 2**20 + 1, 4, 3),  # a ninth segment, rounded up to 12: three per rank
        (100 * 2**20, 16, 7),  # 100 segments of 1 MiB, rounded up to 112
        (8, 16, 2),  # the coordination word: 2N segments, most of them empty
    ],
)
def test_gloo_cuts_an_allreduce_into_at_least_two_segments_per_rank_of_at_most_1_mib(
    payload_bytes, ranks, segments
):
    assert allreduce_segments(payload_bytes, ranks) == segments


@pytest.mark.parametrize(
    ("payload_bytes", "ranks", "filled"),
    [
        (4, 16, 1),  # one float: one segment of 32
        (8, 16, 2),  # two floats: two segments
        (2_468, 1_000, 617),  # 617 four-byte values over 1,000 ranks: one a segment
        (2_466, 1_000, 617),  # segments hold whole elements: the last one is partly filled
        (246_828, 4, 8),  # LeNet's dense gradient fills all 8
    ],
)
def test_gloo_fills_the_first_segments_its_buffer_reaches(payload_bytes, ranks, filled):
    assert allreduce_filled_segments(payload_bytes, ranks) == filled
    assert filled <= allreduce_segments(payload_bytes, ranks) * ranks


def _flat_segments(payload_bytes, ranks):
    """Every rank on one ring: its segments as the reduced model's per-rank arrays."""
    return Segments(
        np.arange(ranks),
        np.full(ranks, ranks),
        np.full(ranks, allreduce_segments(payload_bytes, ranks)),
        np.full(ranks, allreduce_filled_segments(payload_bytes, ranks)),
    )


def _traffic(payload_bytes, ranks):
    flat = _flat_segments(payload_bytes, ranks)
    return [
        allreduce_hop_traffic(flat.position, flat.ring_size, flat.per_rank, flat.filled, hop)
        for hop in range(ring_messages("sum", payload_bytes, ranks).count)
    ]


def test_a_one_float_allreduce_travels_as_the_coordination_chain():
    # Segment 0 alone holds data: rank N-1 sends it down to rank 0 (reduce-scatter), rank 0
    # sends the sum to N-1 and on down to rank 1 (allgather); every other hop is empty.
    ranks = 6
    senders = []
    for sends, receives in _traffic(4, ranks):
        # What rank r sends, rank r-1 receives, in the same hop.
        np.testing.assert_array_equal(receives, np.roll(sends, -1))
        senders.extend(np.flatnonzero(sends).tolist())
    assert senders == [5, 4, 3, 2, 1, 0, 5, 4, 3, 2]


@pytest.mark.parametrize(("payload_bytes", "ranks"), [(4, 6), (2_468, 100), (9_000, 7)])
def test_one_rings_shifted_patterns_are_the_hop_traffic_of_every_rank(payload_bytes, ranks):
    # The reduced model reads a flat ring's traffic as windows of a few patterns; a ring over
    # part of the ranks (a site's) computes it rank by rank. Both must say the same.
    segments = _flat_segments(payload_bytes, ranks)
    assert segments.one_ring
    for hop, (sends, receives) in enumerate(_traffic(payload_bytes, ranks)):
        fast_sends, fast_receives = segments.traffic(hop)
        np.testing.assert_array_equal(fast_sends, sends)
        np.testing.assert_array_equal(fast_receives, receives)


def test_rings_side_by_side_each_carry_their_own_segments():
    # Two sites of three ranks, a one-float sum in each: each site's ring a chain of its own.
    segments = Segments(np.array([0, 1, 2, 0, 1, 2]), np.full(6, 3), np.full(6, 2), np.full(6, 1))
    assert not segments.one_ring
    for hop, (sends, receives) in enumerate(_traffic(4, 3)):
        both_sends, both_receives = segments.traffic(hop)
        np.testing.assert_array_equal(both_sends, np.tile(sends, 2))
        np.testing.assert_array_equal(both_receives, np.tile(receives, 2))


def test_a_full_buffer_sends_and_receives_in_every_hop():
    for sends, receives in _traffic(246_828, 4):
        assert sends.all() and receives.all()


def test_a_ring_of_empty_segments_costs_a_chain_not_the_rendezvous_of_every_hop():
    # Latency 0.1 s each way, the "ready to receive" 0.1 s back. A full ring pays both on
    # every hop pair: 4(N-1) latencies. With one float only the chain's 2(N-1) hops carry it,
    # each to a rank that posted its receive long before: one notification's wait in all.
    ranks, latency = 8, 0.1
    segments = ring_segments(ranks, [list(range(ranks))], 4)
    stage = replace(
        _ring(ranks, latency=latency, notify=latency),
        hops=np.full(ranks, ring_messages("sum", 4, ranks).count),
        in_flight=2,
        segments=segments,
    )
    skipped, _ = ring_finish(np.zeros(ranks), stage, np.zeros(ranks), RNG)
    full, _ = ring_finish(np.zeros(ranks), replace(stage, segments=None), np.zeros(ranks), RNG)
    assert skipped.max() == pytest.approx((2 * (ranks - 1) + 1) * latency)
    assert skipped.argmax() == 1  # the allgather's last stop
    assert full.max() == pytest.approx(4 * (ranks - 1) * latency, rel=0.05)


def test_a_flat_sum_runs_four_n_minus_one_segments_two_in_flight_and_a_gather_n_minus_one():
    fleet = uniform_fleet(LinkProfile("lan", 100_000, 100_000), 4)
    for mode, hops, in_flight, message_bytes in (
        (ExchangeMode("dense"), 12, 2, 240_000 / 8),
        (ExchangeMode("gather", combine="gather"), 3, 1, 240_000),
    ):
        plan = plan_network(fleet, mode, 240_000)
        network = {name: _hops(phase, latency=0.1) for name, phase in plan.phases.items()}
        [stage] = collective_of(fleet, mode, network, 240_000).stages
        np.testing.assert_array_equal(stage.hops, hops)
        assert stage.in_flight == in_flight
        np.testing.assert_array_equal(plan.phases["ring"].sizes_bytes, message_bytes)


def test_one_slow_uplink_sets_the_pace_of_the_whole_ring():
    # Rank 3's uplink takes 0.5 s per message: every one of its six messages waits for the last.
    stage = _ring(4, latency=0.0)
    slow = RingStage(
        stage.upstream,
        np.array([0.1, 0.1, 0.5, 0.1]),  # what rank 2 receives comes from rank 3
        stage.incoming_latency_seconds,
        stage.incoming_jitter_seconds,
        stage.hops,
        stage.notify_seconds,
    )
    finish, _ = ring_finish(np.zeros(4), slow, np.zeros(4), RNG)
    assert finish.max() == pytest.approx(6 * 0.5)


def test_one_long_latency_is_paid_on_every_hop():
    # Rank 2 posts its next receive only once the last message from rank 3 is in, and Gloo's
    # rank 3 sends nothing before that receive is posted: every hop waits out the 0.5 s.
    stage = _ring(4)
    slow = RingStage(
        stage.upstream,
        stage.incoming_transfer_seconds,
        np.array([0.1, 0.1, 0.5, 0.1]),
        stage.incoming_jitter_seconds,
        stage.hops,
        stage.notify_seconds,
    )
    finish, _ = ring_finish(np.zeros(4), slow, np.zeros(4), RNG)
    assert finish.max() == pytest.approx(6 * 0.5)


def test_bbr_paces_an_application_limited_flight_over_half_a_round_trip():
    # p = (g - 1) F / RTT: a whole flight of F bytes (less its first packet train) takes
    # RTT / (g - 1) whatever its size; a message of the flight its share. The train is one
    # segment below 1.2 Mbit/s of pacing (30 kB at 1.2 s: 0.38 Mbit/s), two above (300 kB:
    # 3.8 Mbit/s); a message within it leaves at once.
    round_trip = 1.2
    whole = paced_seconds(np.array([30_000.0, 300_000.0]), 1, round_trip)
    trains = np.array([1, 2]) * SEGMENT_BYTES
    sizes = np.array([30_000.0, 300_000.0])
    np.testing.assert_allclose(
        whole, (sizes - trains) / sizes * round_trip / (BBR_STARTUP_GAIN - 1)
    )
    assert whole[1] == pytest.approx(0.63, abs=0.01)  # about half a round trip
    np.testing.assert_allclose(paced_seconds(30_000.0, 2, round_trip), whole[0] / 2)
    np.testing.assert_allclose(paced_seconds(np.array([0.0, 8.0, 1448.0]), 1, round_trip), 0.0)
    # A small flight paces at BBR's first rate at least, g x 10 segments per round trip: on a
    # 1.2 s round trip 0.28 Mbit/s (what the fleet's coordination-only connections paced at),
    # on LTE's 0.14 s 2.4 Mbit/s, where a train is two segments.
    first_rate = BBR_STARTUP_GAIN * 10 * SEGMENT_BYTES
    assert first_rate * 8 / 1.2 == pytest.approx(0.278e6, rel=0.01)
    np.testing.assert_allclose(
        paced_seconds(5_000.0, 1, 0.14), (5_000 - 2 * SEGMENT_BYTES) / (first_rate / 0.14)
    )
    # No round trip (a rates-only link): nothing to pace against.
    assert paced_seconds(30_000.0, 1, 0.0) == 0.0
    with pytest.raises(ValueError, match="message sizes must be >= 0 bytes, got \\[-1.\\]"):
        paced_seconds(np.array([-1.0]), 1, round_trip)
    with pytest.raises(ValueError, match="flight_messages must be an integer >= 1, got 0"):
        paced_seconds(1000.0, 0, round_trip)


def test_a_message_takes_the_links_time_or_bbrs_pacing_whichever_is_longer():
    # 30 kB messages two at a time: at a 1.2 s round trip the pacing (0.30 s each) is slower
    # than the link (0.05 s); at 0.14 s (LTE) the link is the slower.
    order = [0, 1, 2, 3]
    phase = Phase.of(order, order[-1:] + order[:-1], [30_000] * 4)
    upstream = np.roll(np.arange(4), -1)
    for one_way, expected in ((0.6, paced_seconds(30_000.0, 2, 1.2)), (0.07, 0.05)):
        latency = np.full(4, one_way)
        hops = Hops(phase, np.full(4, 0.05), latency, np.zeros(4), latency)
        stage = RingStage.of(4, hops, upstream, np.full(4, 12), in_flight=2)
        np.testing.assert_allclose(stage.incoming_transfer_seconds, expected)
    assert paced_seconds(30_000.0, 2, 1.2) == pytest.approx(0.30, abs=0.01)
    # A lone coordination word fits the first burst: its time is the link's and its latency.
    word = Hops(Phase.of([1], [0], [8]), np.full(1, 0.001), np.full(1, 0.6), np.zeros(1),
                np.full(1, 0.6))  # fmt: skip
    np.testing.assert_allclose(word.seconds, 0.601)


def test_a_neighbour_running_ahead_queues_its_bytes_behind_its_last_message():
    # Rank 1 starts 1 s early; its messages still leave one transfer time apart.
    stage = RingStage(
        np.array([1, 0]),
        np.array([0.2, 0.2]),
        np.zeros(2),
        np.zeros(2),
        np.array([2, 2]),
        np.zeros(2),
    )
    finish, _ = ring_finish(np.array([1.0, 0.0]), stage, np.zeros(2), RNG)
    assert finish[0] == pytest.approx(1.0 + 0.2 + 0.2)


def _estimate(mode, ranks=4, latency=0.1, compute=0.05, timeout=30.0, cores=1.0, epoch_steps=None):
    fleet = uniform_fleet(LinkProfile("test", 5000, 17500), ranks)
    fleet = type(fleet)(tuple(type(d)(d.profile, cpu_cores=cores) for d in fleet.devices))
    order = list(range(ranks))
    phase = Phase.of(order, order[-1:] + order[:-1], [1000] * ranks)
    hops = Hops(phase, np.zeros(ranks), np.full(ranks, latency), np.zeros(ranks), np.zeros(ranks))
    network = {"chain": hops, "ring": hops}
    workload = Workload(240_000, 0.005, np.full(ranks, compute), epoch_steps)
    parameters = ExchangeParameters(gloo_timeout_seconds=timeout)
    return simulate_steps(fleet, mode, workload, parameters, network, max_steps=40)


def test_a_step_is_the_cycle_that_missed_the_tensors_the_one_that_sees_them_and_the_ring():
    estimate = _estimate(ExchangeMode("dense"))
    # Right after a collective every rank starts a cycle without its tensors (50 ms compute);
    # rank N-1 leaves it after N hops and starts the next, which sees every rank. Its word
    # waits for rank N-2, a hop behind, to post its receive; 2(N-1) hops later rank 1 has the
    # result; then the ring's 2(N-1) hops. N = 4, 0.1 s per hop.
    assert estimate.step_seconds == pytest.approx((4 + 1 + 6 + 6) * 0.1, rel=0.01)
    assert estimate.cycles_per_step == pytest.approx(2.0)
    assert not estimate.timed_out


def test_a_second_summed_round_misses_the_cycle_in_progress_then_waits_for_its_own():
    one = _estimate(ExchangeMode("dense"))
    two = _estimate(ExchangeMode("powersgd", rounds=2))
    # The second round's tensors (PowerSGD's Q, made from the summed P) reach Horovod just
    # after the first ring ends, when every loop has already begun its next cycle: like a
    # step's gradients, they wait for that cycle (N hops), then for their own (1 + 2(N-1)),
    # then the second ring's 2(N-1) hops. N = 4, 0.1 s per hop: a round costs what a step does.
    assert two.step_seconds - one.step_seconds == pytest.approx((4 + 1 + 6 + 6) * 0.1, rel=0.01)
    assert two.cycles_per_step == pytest.approx(one.cycles_per_step + 2)
    # The same payload, split between the rounds: the same bytes besides the two cycles'.
    coordination = ExchangeParameters().coordination_bytes_per_cycle
    assert two.device_tx_bytes_per_step - 2 * coordination == pytest.approx(
        one.device_tx_bytes_per_step
    )


def _hops(phase, latency):
    """Every message of `phase` takes `latency` seconds and no transfer time."""
    count = len(phase.sources)
    return Hops(phase, np.zeros(count), np.full(count, latency), np.zeros(count), np.zeros(count))


def test_the_hierarchys_three_operations_each_wait_for_a_cycle_of_their_own():
    profile = LinkProfile("test", 5000, 17500)
    up, down = link_directions(profile)
    sites = (Site("a", up, down), Site("b", up, down))
    fleet = Fleet(tuple(Device(profile, cpu_cores=1.0, site=rank // 2) for rank in range(4)), sites)
    mode = ExchangeMode("sites", hierarchy="sites")
    network = {
        name: _hops(phase, latency=0.1)
        for name, phase in plan_network(fleet, mode, 240_000).phases.items()
    }
    workload = Workload(240_000, 0.005, np.full(4, 0.05))
    estimate = simulate_steps(fleet, mode, workload, ExchangeParameters(), network, max_steps=40)
    # The flat ring's two cycles (one misses the tensors, the next sees them), then one more
    # before the leaders' sum and one before the broadcast back into the sites.
    assert estimate.cycles_per_step == pytest.approx(2 + 2)
    # Each extra cycle's word crosses the 4-rank ring twice: 6 hops of 0.1 s, twice.
    assert estimate.collective_seconds >= 2 * 6 * 0.1


def _two_sites_of_two():
    profile = LinkProfile("test", 5000, 17500)
    up, down = link_directions(profile)
    sites = (Site("a", up, down), Site("b", up, down))
    return Fleet(tuple(Device(profile, cpu_cores=1.0, site=rank // 2) for rank in range(4)), sites)


def test_a_hierarchy_cycle_agrees_on_the_process_sets_then_coordinates_every_set_in_turn():
    fleet = _two_sites_of_two()
    cycles = {}
    for mode in (ExchangeMode("sites", hierarchy="sites"), ExchangeMode("flat")):
        phases = plan_network(fleet, mode, 240_000).phases
        network = {name: _hops(phase, latency=0.1) for name, phase in phases.items()}
        cycles[mode.name] = coordination_of(fleet, mode, network)
    start, cpu = np.zeros(4), np.zeros(4)
    flat, _, _ = cycles["flat"].run(start, cpu, RNG)
    # The global word's chain alone: 2(N-1) = 6 messages of 0.1 s; rank 1 has it last.
    assert flat == pytest.approx([0.3, 0.6, 0.5, 0.4])
    sites, _, where = cycles["sites"].run(start, cpu, RNG)
    # Dynamic process sets: the two-integer allgather first (N-1 = 3 hops, all done at 0.3),
    # the global chain (done at 0.6-0.9), each site's chain (rank 1 at 1.1, rank 3 at 1.0),
    # then the leaders' (ranks 0 and 2: 1.1 and 1.2). Twice the flat cycle.
    assert sites == pytest.approx([1.1, 1.1, 1.2, 1.0])
    # The longest wait for one message: rank 0, in its site's chain from 0.6 until rank 1's
    # word comes at 1.0.
    assert where == "site coordination chain"
    # Messages per cycle: 3 in the allgather, the global chain's, the site's, the leaders'.
    assert cycles["sites"].sends(4).tolist() == [3 + 1 + 1 + 1, 3 + 1 + 1, 3 + 2 + 1 + 1, 3 + 2 + 1]
    assert cycles["flat"].sends(4).tolist() == chain_sends(4).tolist()


def test_the_allgather_of_one_word_ends_when_the_farthest_word_has_come_round_the_ring():
    hop, notify = np.array([0.1, 0.2, 0.3, 0.4]), np.full(4, 0.05)
    # Entered together: rank q waits for the word of rank q+3, three hops away (each hop the
    # receiver's notification back and the message there). Rank 0: words from 3 -> 2 -> 1 -> 0.
    done = ring_allgather_word(np.zeros(4), hop, notify, np.zeros(4))
    assert done[0] == pytest.approx((0.4 + 0.05) + (0.3 + 0.05) + (0.2 + 0.05))
    # Rank 1 receives all three words over its link from rank 2, one after the other.
    assert done[1] == pytest.approx(3 * (0.3 + 0.05))
    # A late rank holds everyone up by its lateness, less its distance, and then receives its
    # own three words one hop after the other.
    late = ring_allgather_word(
        np.array([0.0, 0.0, 0.0, 5.0]), np.full(4, 0.1), np.zeros(4), np.zeros(4)
    )
    assert late == pytest.approx([5.3, 5.2, 5.1, 5.3])


def test_local_steps_with_overlap_hide_the_exchange_behind_compute():
    plain = _estimate(ExchangeMode("local", local_steps=8), compute=0.2)
    overlapped = _estimate(ExchangeMode("local", local_steps=8, overlap=True), compute=0.2)
    assert overlapped.step_seconds < plain.step_seconds
    # With overlap a round costs the longer of its compute (8 x 0.2 s) and its exchange.
    assert overlapped.step_seconds == pytest.approx(
        max(1.6, plain.step_seconds * 8 - 1.6) / 8, rel=0.1
    )


def test_overlap_with_a_short_round_hands_its_delta_over_after_the_cycle_began():
    # Compute (8 x 10 ms) is shorter than the exchange. A device hands round t+1's delta to
    # Horovod only once round t has finished, when the loop has already begun a cycle without
    # it: that cycle, then one that sees it, then the ring, as without overlap. The compute
    # is hidden in both (it fits in the missed cycle), so overlap saves nothing here.
    plain = _estimate(ExchangeMode("local", local_steps=8), compute=0.01)
    overlapped = _estimate(ExchangeMode("local", local_steps=8, overlap=True), compute=0.01)
    assert plain.step_seconds * 8 == pytest.approx((4 + 1 + 6 + 6) * 0.1, rel=0.02)
    assert overlapped.step_seconds == pytest.approx(plain.step_seconds, rel=0.02)
    assert overlapped.cycles_per_step == pytest.approx(plain.cycles_per_step)


def test_an_epochs_end_drains_the_overlapped_round_in_flight():
    # Rounds of 8 steps of 0.1 s against a longer exchange: overlap hides the compute...
    plain = _estimate(ExchangeMode("local", local_steps=8), compute=0.1)
    overlapped = ExchangeMode("local", local_steps=8, overlap=True)
    hidden = _estimate(overlapped, compute=0.1)
    assert hidden.step_seconds < 0.8 * plain.step_seconds
    # ...unless every round ends with an epoch: the loop waits for the round it just handed
    # over before the next starts, and nothing overlaps (both pause for validation alike).
    every = _estimate(overlapped, compute=0.1, epoch_steps=8)
    plain_every = _estimate(ExchangeMode("local", local_steps=8), compute=0.1, epoch_steps=8)
    assert every.step_seconds == pytest.approx(plain_every.step_seconds, rel=0.05)
    # Epochs of 12 steps: one round in three stops after 4 steps for the round before, one
    # in three is waited for; the others overlap.
    some = _estimate(overlapped, compute=0.1, epoch_steps=12)
    assert hidden.step_seconds < some.step_seconds < every.step_seconds


def test_an_epochs_totals_reach_the_ranks_a_hop_apart():
    # Three float64 over 4 ranks, 0.1 s a hop: the few filled segments go round the ring one
    # small message a hop; rank 0 has the sum first, the others a hop later.
    ranks = 4
    order = list(range(ranks))
    phase = Phase.of(order, order[-1:] + order[:-1], [1000] * ranks)
    hops = Hops(phase, np.zeros(ranks), np.full(ranks, 0.1), np.zeros(ranks), np.zeros(ranks))
    fleet = uniform_fleet(LinkProfile("test", 5000, 17500), ranks)
    totals = totals_allreduce_of(fleet, {"chain": hops}, EPOCH_TOTALS_BYTES)
    finish, _ = totals.finish(np.zeros(ranks), np.zeros(ranks), RNG)
    assert finish[1:] - finish[0] == pytest.approx([0.1] * 3)


def test_a_plain_round_after_an_epochs_end_restarts_a_hop_apart():
    # An epoch's end after every round of 8 steps (10 ms each): the epoch's totals are summed,
    # and rank 0, which has them a hop (0.1 s) before the others, starts its round that much
    # ahead; the others then set the round's pace. The epoch's end is no part of the step.
    mode = ExchangeMode("local", local_steps=8)
    steady = _estimate(mode, compute=0.01)
    after = _estimate(mode, compute=0.01, epoch_steps=8)
    assert after.step_seconds * 8 == pytest.approx(steady.step_seconds * 8 + 0.1)
    assert after.compute_seconds * 8 == pytest.approx(0.08)
    # The loop's wall of each round holds the epoch's end too.
    assert min(after.round_seconds[1:]) > after.step_seconds * 8 + 1.0
    # Every round of the run is simulated (they repeat only every few epochs in general).
    assert after.simulated_steps == 40 > steady.simulated_steps


def test_each_rounds_wall_is_timed_from_the_loops_round_end_to_the_next():
    # Without overlap the loop ends a round with its collective: every round alike.
    plain = _estimate(ExchangeMode("local", local_steps=8), compute=0.1)
    assert plain.round_seconds == pytest.approx([plain.step_seconds * 8] * 3)
    # With overlap it ends one once its compute is done and the round before's exchange is
    # back: the first round is its compute alone (0.8 s), later ones wait for the exchange.
    overlapped = ExchangeMode("local", local_steps=8, overlap=True)
    hidden = _estimate(overlapped, compute=0.1)
    assert hidden.round_seconds[0] == pytest.approx(0.8)
    assert hidden.round_seconds[-1] == pytest.approx(hidden.step_seconds * 8)
    # Epochs of 12 steps: the round after the one an epoch ends with (steps 24-31) starts
    # with the drain's wait for that round's exchange, and is longer than the rounds before.
    drained = _estimate(overlapped, compute=0.1, epoch_steps=12)
    assert len(drained.round_seconds) == 5
    assert drained.round_seconds[3] > max(drained.round_seconds[:3])
    assert drained.round_seconds[3] > hidden.step_seconds * 8


def test_an_epoch_end_is_found_inside_a_round_or_at_its_end():
    assert _epoch_ends(0, 64, 31) == (31, False)  # steps 0-63: the first epoch ends after 31
    assert _epoch_ends(1, 64, 31) == (29, False)  # steps 64-127: after 93, 29 steps in
    assert _epoch_ends(0, 16, 16) == (0, True)  # the round and the epoch end together
    assert _epoch_ends(3, 16, 62) == (14, False)  # steps 48-63: the epoch ends after 62
    assert _epoch_ends(2, 8, 12) == (0, True)  # steps 16-23
    with pytest.raises(ValueError, match="epoch_steps must be >= 1 or None, got 0"):
        Workload(1.0, 0.005, np.zeros(2), 0)


def test_a_quarter_core_computes_within_its_quota_at_full_speed_and_beyond_it_throttled():
    within = _estimate(ExchangeMode("dense"), compute=0.02, cores=0.25)
    beyond = _estimate(ExchangeMode("dense"), compute=0.05, cores=0.25)
    # 20 ms fit the 25 ms quota of a 100 ms period: no slower than on a whole core (a fluid
    # quarter core would take 80 ms). 50 ms do not: the rest waits for the next period.
    assert within.compute_seconds == pytest.approx(0.02, rel=0.05)
    assert beyond.compute_seconds > 1.5 * 0.05


def test_a_wait_longer_than_gloos_timeout_is_reported():
    estimate = _estimate(ExchangeMode("dense"), ranks=40, latency=1.0)
    assert estimate.timed_out
    assert "coordination" in estimate.timeout_reason
    assert estimate.longest_wait_seconds == pytest.approx(40.0, rel=0.05)
    assert not _estimate(ExchangeMode("dense"), ranks=20, latency=1.0).timed_out


def test_bad_modes_are_refused_with_the_value():
    with pytest.raises(ValueError, match="combine"):
        ExchangeMode("x", combine="scatter")
    with pytest.raises(ValueError, match="summable"):
        ExchangeMode("x", combine="gather", hierarchy="sites")
    with pytest.raises(ValueError, match="rounds must be an integer >= 1, got 0"):
        ExchangeMode("x", rounds=0)
    with pytest.raises(ValueError, match="rounds > 1"):
        ExchangeMode("x", combine="gather", rounds=2)
    with pytest.raises(ValueError, match="cycle_time_seconds"):
        Workload(1.0, 0.0, np.zeros(2))
