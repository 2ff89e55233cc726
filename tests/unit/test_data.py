"""Batches, the experience FIFO, PPO's minibatches and the console output helper."""
from __future__ import annotations

import os
import threading

import numpy as np

from ddrl import output
from ddrl.acting.experience import ExperienceFifo, Segment, SegmentBuilder, segments_batch
from ddrl.algos.actor_critic import A2C, nstep_returns
from ddrl.algos.batch import Batch, Rollout
from ddrl.algos.ppo import PPO
from ddrl.algos.vtrace import VTrace
from ddrl.config import Config


def batch(lo: int, hi: int) -> Batch:
    idx = np.arange(lo, hi)
    return Batch(idx[:, None].astype(np.uint8), idx.astype(np.int32), idx.astype(np.int64),
                 {"returns": idx.astype(np.float32)})


def segment(lo: int, hi: int, done: bool = False) -> Segment:
    idx = np.arange(lo, hi)
    f = idx.astype(np.float32)
    dones = np.zeros(len(idx), np.float32)
    dones[-1] = done
    return Segment(idx[:, None].astype(np.uint8), idx.astype(np.int32), f, dones, -f / 100,
                   f * 10, idx.astype(np.int64), None if done else np.array([hi], np.uint8),
                   0.0 if done else 10.0 * hi)


def test_fifo_take_cuts_exactly_and_keeps_the_rest():
    fifo = ExperienceFifo(8, threading.Event())
    for lo in (0, 5, 10):
        assert fifo.put(segment(lo, lo + 5))
    first = fifo.take(7)
    second = fifo.take(8)
    assert [len(s) for s in first] == [5, 2] and [len(s) for s in second] == [3, 5]
    assert np.concatenate([s.actions for s in first]).tolist() == list(range(7))
    assert np.concatenate([s.actions for s in second]).tolist() == list(range(7, 15))
    # The cut segment's head is bootstrapped on the first observation of its tail.
    assert first[1].next_obs.tolist() == [7] and first[1].bootstrap == 70.0
    assert second[0].next_obs.tolist() == [10] and second[0].bootstrap == 100.0


def test_fifo_take_returns_none_once_stopping():
    stop = threading.Event()
    fifo = ExperienceFifo(2, stop)
    stop.set()
    assert fifo.take(1) is None
    assert not fifo.put(segment(0, 1))


def test_segment_ends_at_t_max_or_done():
    seg = SegmentBuilder(t_max=3)
    obs = np.zeros(2, np.uint8)
    assert not seg.add(obs, 0, 1.0, False, -0.1, 0.5, 0)
    assert seg.add(obs, 1, 1.0, True, -0.2, 0.6, 0)
    out = seg.flush(obs, bootstrap=100.0)
    assert out.next_obs is None and out.bootstrap == 0.0
    np.testing.assert_allclose(out.logp, [-0.1, -0.2])
    assert seg.add(obs, 0, 1.0, False, -0.1, 0.5, 0) is False


def test_segments_batch_gives_each_segment_its_own_nstep_returns():
    cfg = Config()
    cfg.algo.gamma = 0.5
    parts = [segment(0, 3), segment(3, 4, done=True), segment(4, 9)]
    out = segments_batch(parts, A2C(cfg), predict=None)
    expect = np.concatenate([
        nstep_returns(s.rewards[:, None], s.dones[:, None], np.array([s.bootstrap]), 0.5)[:, 0]
        for s in parts])
    assert out.actions.tolist() == list(range(9)) and out.acted_at.tolist() == list(range(9))
    np.testing.assert_allclose(out.targets["returns"], expect, rtol=1e-6)


def test_segments_batch_gives_off_policy_algorithms_the_current_policy():
    cfg = Config()
    parts = [segment(0, 3), segment(3, 5, done=True)]
    seen = []

    def predict(obs):
        seen.append(obs[:, 0].tolist())
        logits = np.zeros((len(obs), 5), np.float32)
        return logits, obs[:, 0].astype(np.float32)

    out = segments_batch(parts, VTrace(cfg), predict)
    # One forward pass: every step, then the bootstrap observation of the unfinished segment.
    assert seen == [[0, 1, 2, 3, 4, 3]]
    rollout = Rollout(np.array([[0, 0], [1, 3], [2, 4]], np.float32),
                      np.array([[0, 0], [0, 0], [0, 1]], np.float32),
                      np.array([[0, 0], [1, 3], [2, 4]], np.float32),
                      np.array([[0, 0], [-0.01, -0.03], [-0.02, -0.04]], np.float32),
                      np.array([3, 0], np.float32),
                      np.full((3, 2), np.log(1 / 5), np.float32))
    rollout.logp[0, 0] = 0.0
    expect = VTrace(cfg).targets(rollout)
    real = [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1)]
    for key in ("returns", "advantages"):
        np.testing.assert_allclose(out.targets[key], [expect[key][t, n] for t, n in real],
                                   rtol=1e-6)


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
    from ddrl.loop.progress import Progress

    now = [100.0]
    progress = Progress(60.0, max_frames=2_000_000, max_minutes=0, start_frames=1_000_000,
                        clock=lambda: now[0])
    now[0] += 10.0
    progress.maybe_print(1_070_000, elapsed=5000.0, update=10, final=True)
    line = capsys.readouterr().out
    # 70,000 frames in 10 s since the restart (not 1,070,000): 930,000 left take 132 s.
    assert "7,000 frames/s" in line and "left 00:02:12" in line, line


def test_the_final_progress_line_gives_the_mean_rate_since_the_start(capsys):
    from ddrl.loop.progress import Progress

    now = [0.0]
    progress = Progress(60.0, max_frames=10_000_000, max_minutes=0, clock=lambda: now[0])
    now[0] = 60.0
    progress.maybe_print(600_000, elapsed=60.0, update=100)
    # The last stretch is a final evaluation and checkpoint: 20 s and few frames.
    now[0] = 80.0
    progress.maybe_print(600_400, elapsed=80.0, update=101, final=True)
    periodic, final = capsys.readouterr().out.splitlines()
    assert "10,000 frames/s" in periodic, periodic
    assert "7,505 frames/s" in final, final


def test_progress_lines_without_new_frames_repeat_the_last_rate(capsys):
    """PPO's frames arrive a rollout at a time, between many updates: a line between two
    rollouts is not 0 frames/s and its time left not hours; the next rollout's line averages
    over the whole stretch since the last new frames."""
    from ddrl.loop.progress import Progress

    now = [0.0]
    progress = Progress(10.0, max_frames=1_000_000, max_minutes=0, clock=lambda: now[0])
    for t, frames in ((10.0, 100_000), (20.0, 100_000), (30.0, 300_000)):
        now[0] = t
        progress.maybe_print(frames, elapsed=t, update=int(t))
    first, between, after = capsys.readouterr().out.splitlines()
    assert "10,000 frames/s" in first and "left 00:01:30" in first, first
    assert "10,000 frames/s" in between and "left 00:01:30" in between, between
    assert "10,000 frames/s" in after and "left 00:01:10" in after, after
