"""Batches, the experience FIFO, PPO's minibatches and the console output helper."""
from __future__ import annotations

import os
import threading

import numpy as np

from ddrl import output
from ddrl.algos.batch import Batch
from ddrl.algos.ppo import PPO
from ddrl.config import Config
from ddrl.node.experience import ExperienceFifo, SegmentBuilder


def batch(lo: int, hi: int) -> Batch:
    idx = np.arange(lo, hi)
    return Batch(idx[:, None].astype(np.uint8), idx.astype(np.int32), idx.astype(np.int64),
                 {"returns": idx.astype(np.float32)})


def test_fifo_take_cuts_exactly_and_keeps_the_rest():
    fifo = ExperienceFifo(8, threading.Event())
    for lo in (0, 5, 10):
        assert fifo.put(batch(lo, lo + 5))
    first = fifo.take(7)
    second = fifo.take(8)
    assert first.actions.tolist() == list(range(7))
    assert second.actions.tolist() == list(range(7, 15))
    assert second.targets["returns"].tolist() == list(range(7, 15))


def test_fifo_take_returns_none_once_stopping():
    stop = threading.Event()
    fifo = ExperienceFifo(2, stop)
    stop.set()
    assert fifo.take(1) is None
    assert not fifo.put(batch(0, 1))


def test_segment_ends_at_t_max_or_done():
    seg = SegmentBuilder(t_max=3, gamma=0.5)
    obs = np.zeros(2, np.uint8)
    assert not seg.add(obs, 0, 1.0, False, 0)
    assert seg.add(obs, 1, 1.0, True, 0)
    out = seg.flush(bootstrap_value=100.0)
    np.testing.assert_allclose(out.targets["returns"], [1.5, 1.0])


def test_ppo_minibatches_cover_every_point_once_per_epoch():
    cfg = Config()
    cfg.algo.epochs, cfg.algo.minibatches = 3, 4
    parts = PPO(cfg).minibatches(batch(0, 22), np.random.default_rng(0))
    assert len(parts) == 12
    for epoch in range(3):
        seen = np.concatenate([p.actions for p in parts[epoch * 4:(epoch + 1) * 4]])
        assert sorted(seen.tolist()) == list(range(22))
        assert all(len(p) in (5, 6) for p in parts[epoch * 4:(epoch + 1) * 4])
    for p in parts:  # every field cut by the same index
        np.testing.assert_array_equal(p.targets["returns"], p.actions)


def test_say_writes_each_line_in_one_write(monkeypatch):
    read_fd, write_fd = os.pipe()
    calls = []
    real_write = os.write

    def counting_write(fd, data):
        calls.append(bytes(data))
        return real_write(fd, data)

    class Stream:
        def fileno(self):
            return write_fd

        def flush(self):
            pass

    monkeypatch.setattr(output.os, "write", counting_write)
    monkeypatch.setattr(output.sys, "stdout", Stream())
    output.say("[ddrl] rank 1 final weights sha256 abc")
    os.close(write_fd)
    assert calls == [b"[ddrl] rank 1 final weights sha256 abc\n"]
    assert os.read(read_fd, 1000) == calls[0]
    os.close(read_fd)


def test_progress_rate_counts_only_this_process_frames_after_a_resume(capsys):
    from ddrl.progress import Progress

    now = [100.0]
    progress = Progress(60.0, max_frames=2_000_000, max_minutes=0, start_frames=1_000_000,
                        clock=lambda: now[0])
    now[0] += 10.0
    progress.maybe_print(1_070_000, elapsed=5000.0, update=10, force=True)
    line = capsys.readouterr().out
    # 70,000 frames in 10 s since the restart (not 1,070,000): 930,000 left take 132 s.
    assert "7,000 frames/s" in line and "left 00:02:12" in line, line
