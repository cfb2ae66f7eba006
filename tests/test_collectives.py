from __future__ import annotations

import pytest

from globaldl.collectives import (
    GLOO_PREAMBLE_BYTES,
    CollectiveLedger,
    RankTraffic,
    calls_from_dicts,
    rank_traffic,
    ring_allgather,
    ring_allreduce,
    tree_broadcast,
    tx_bytes_per_wire_byte,
)

SIZES = [1, 24, 1000, 247_000, 3_000_001, 5 * 1024 * 1024 + 12]


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("buffer_bytes", SIZES)
def test_ring_allreduce_ranks_together_send_every_byte_2_n_minus_1_times(
    ranks: int, buffer_bytes: int
) -> None:
    element_bytes = 1 if buffer_bytes % 4 else 4
    sent = [ring_allreduce(buffer_bytes, ranks, r, element_bytes) for r in range(ranks)]
    # Reduce-scatter and allgather each pass every segment N-1 times round the ring.
    assert sum(t.payload_bytes for t in sent) == 2 * (ranks - 1) * buffer_bytes
    # What one rank sends another receives: the ring's messages balance.
    assert sum(t.messages_sent for t in sent) == sum(t.messages_received for t in sent)
    # Segment rounding moves at most a few elements between ranks.
    mean = 2 * (ranks - 1) / ranks * buffer_bytes
    assert all(abs(t.payload_bytes - mean) <= 4 * ranks * element_bytes for t in sent)


def test_ring_allreduce_cuts_large_buffers_into_at_most_one_mebibyte_segments() -> None:
    # 8 MiB on 2 ranks: 8 segments (not the minimum of 4), each sent in both phases.
    one = ring_allreduce(8 * 1024 * 1024, 2, 0)
    assert one.messages_sent == 8 and one.payload_bytes == 8 * 1024 * 1024


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_ring_allgather_sends_each_rank_payload_to_every_other_rank(ranks: int) -> None:
    for rank in range(ranks):
        sent = ring_allgather(1000, ranks, rank)
        assert sent == RankTraffic(1000 * (ranks - 1), ranks - 1, ranks - 1)


@pytest.mark.parametrize("ranks", [2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("root", [0, 1])
def test_tree_broadcast_sends_the_buffer_n_minus_1_times_root_log2_n(ranks: int, root: int) -> None:
    sent = [tree_broadcast(100, ranks, r, root=root) for r in range(ranks)]
    assert sum(t.payload_bytes for t in sent) == 100 * (ranks - 1)
    assert sent[root].messages_sent == (ranks - 1).bit_length()
    assert sent[root].messages_received == 0
    # Every other rank receives the buffer exactly once.
    assert all(t.messages_received == 1 for r, t in enumerate(sent) if r != root)


def test_one_rank_sends_nothing() -> None:
    for op in ("allreduce", "allgather", "broadcast"):
        assert rank_traffic(op, 1000, 1, 0) == RankTraffic()


def test_gloo_frames_each_message_with_two_preambles_sent_and_one_received() -> None:
    traffic = RankTraffic(payload_bytes=1000, messages_sent=3, messages_received=2)
    assert traffic.framing_bytes == GLOO_PREAMBLE_BYTES * (2 * 3 + 2)
    assert traffic.tx_bytes == 1000 + traffic.framing_bytes
    assert traffic.times(2) == traffic + traffic


@pytest.mark.parametrize(
    ("combine", "ranks", "factor"),
    [("sum", 1, 0.0), ("gather", 1, 0), ("sum", 2, 1.0), ("gather", 2, 1)]
    + [("sum", 4, 1.5), ("gather", 4, 3), ("sum", 8, 1.75), ("gather", 8, 7)],
)
def test_compressed_payloads_are_gathered_to_n_minus_1_peers_dense_ones_ring_reduced(
    combine: str, ranks: int, factor: float
) -> None:
    assert tx_bytes_per_wire_byte(combine, ranks) == factor
    # The factor is the mean over ranks of the algorithm itself.
    op = "allreduce" if combine == "sum" else "allgather"
    mean = sum(rank_traffic(op, 4000, ranks, r, 4).payload_bytes for r in range(ranks)) / ranks
    assert mean == pytest.approx(factor * 4000)


def test_bad_collective_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="combine must be 'sum' or 'gather', got 'mean'"):
        tx_bytes_per_wire_byte("mean", 4)
    with pytest.raises(ValueError, match="rank must be in 0..3, got 4"):
        ring_allgather(10, 4, 4)
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        CollectiveLedger().record("alltoall", 10)


def test_the_ledger_groups_calls_by_kind_and_size_and_round_trips() -> None:
    ledger = CollectiveLedger()
    for _ in range(3):
        ledger.record("broadcast", 400, 4)
    ledger.record("allreduce", 24, 8)
    ledger.record("allreduce", 24, 8)
    calls = ledger.calls()
    assert [(c.op, c.buffer_bytes, c.calls) for c in calls] == [
        ("allreduce", 24, 2),
        ("broadcast", 400, 3),
    ]
    assert calls_from_dicts([c.to_dict() for c in calls]) == calls
    # Three broadcasts from rank 0 on 4 ranks: the root sends each to two children.
    assert calls[1].traffic(4, 0).payload_bytes == 3 * 2 * 400
