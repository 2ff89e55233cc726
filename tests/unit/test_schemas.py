"""Message layouts: the side channel and the parameter-server messages, packed and unpacked by
field name."""
from __future__ import annotations

import numpy as np
import pytest

from ddrl.distributed import ps
from ddrl.distributed.schema import Schema
from ddrl.loop.bookkeeping import RANK_FIELDS, ROOT_STOPS, side_channel


def test_schema_round_trip_scalars_and_blocks():
    s = Schema("a", ("block", 3), "b", dtype=np.float32)
    assert s.size == 5 and s.names == ("a", "block", "b")
    buf = s.pack(a=1.5, block=[1, 2, 3], b=-2)
    assert buf.dtype == np.float32 and buf.tolist() == [1.5, 1, 2, 3, -2]
    out = s.unpack(buf)
    assert out["a"] == 1.5 and isinstance(out["a"], float)
    assert out["block"].tolist() == [1, 2, 3] and out["b"] == -2


def test_schema_partial_block_add_and_views():
    s = Schema("n", ("items", 4), dtype=np.int64)
    buf = s.pack(n=2, items=[7, 9])
    assert buf.tolist() == [2, 7, 9, 0, 0]
    s.add(buf, "n", 3)
    s.get(buf, "items")[[1, 3]] += 1  # a block is a view: in-place updates land in the buffer
    assert buf.tolist() == [5, 7, 10, 0, 1]


def test_schema_rejects_unknown_fields_duplicates_and_short_messages():
    s = Schema("a", ("b", 2))
    with pytest.raises(KeyError, match="no field 'c'"):
        s.pack(c=1)
    with pytest.raises(ValueError, match="twice"):
        Schema("a", ("a", 2))
    with pytest.raises(ValueError, match="needs 3"):
        s.unpack(np.zeros(2))


def test_side_channel_sums_across_ranks_field_by_field():
    ranks = 3
    side = side_channel(ranks)
    bufs = []
    for r in range(ranks):
        buf = side.pack(signalled=float(r == 2), frames=100 * (r + 1))
        if r == 0:
            side.set(buf, "stop", ROOT_STOPS.index("time"))
        n = len(RANK_FIELDS)
        side.get(buf, "ranks")[n * r:n * (r + 1)] = np.arange(n) + 10 * r
        bufs.append(buf)
    total = side.unpack(np.sum(bufs, axis=0))
    assert total["signalled"] == 1 and ROOT_STOPS[int(total["stop"])] == "time"
    assert total["frames"] == 600
    per_rank = total["ranks"].reshape(ranks, len(RANK_FIELDS))
    assert per_rank[:, 0].tolist() == [0, 10, 20] and per_rank[2, -1] == 20 + len(RANK_FIELDS) - 1


def test_parameter_server_messages_keep_their_fields_apart():
    workers, extras = 3, 5
    meta = ps.meta_schema(extras).pack(kind=ps.GRAD, version=7, sent=12, want_state=1,
                                       extras=np.arange(extras))
    # A server learns the side channel's size from the message's length.
    head = ps.meta_schema(0).size
    got = ps.meta_schema(meta.size - head).unpack(meta)
    assert (got["kind"], got["version"], got["sent"], got["want_state"]) == (ps.GRAD, 7, 12, 1)
    assert got["extras"].tolist() == list(range(extras))

    interval = ps.interval_schema(workers, extras)
    reply = np.concatenate([ps.STATUS.pack(version=4, lost=1),
                            interval.pack(contributors=2, reports=[1, 0, 3], applied=[1, 0, 1],
                                          extras=np.ones(extras))])
    status = ps.STATUS.unpack(reply)
    assert status["version"] == 4 and status["lost"] == 1 and status["received"] == 0
    part = interval.unpack(reply[ps.STATUS.size:])
    assert part["reports"].tolist() == [1, 0, 3] and part["applied"].tolist() == [1, 0, 1]
    assert part["extras"].sum() == extras and part["contributors"] == 2

    control = ps.control_schema(workers)
    msg = control.pack(op=ps.APPLY, count=2, workers=[2, 0])
    assert msg.dtype == np.int64
    assert control.get(msg, "workers")[:int(control.get(msg, "count"))].tolist() == [2, 0]
