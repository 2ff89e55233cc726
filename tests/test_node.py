"""The single-rank node on real games: it learns, logs, checkpoints and resumes."""
from __future__ import annotations

import re
import signal
import subprocess
import time

import h5py
import imageio_ffmpeg
import numpy as np
import pytest
from conftest import DDRL, JOBS, NO_EVAL, ROOT, assert_solved, ddrl, env_for_tests, root_attrs, table
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ddrl.loop.trainer import EXIT_SIGNALLED
from ddrl.rundir.log import ROOT_ATTRIBUTES

CARTPOLE_BUDGET = 300_000


@pytest.mark.parametrize("mode,algo", [("ba3c", "a2c"), ("a2c", "a2c"), ("ba3c", "vtrace"),
                                       ("ba3c", "appo")])
def test_cartpole_learns(mode, algo, run_dir):
    """Greedy evaluation reaches 400 within a bounded number of frames, with each node mode
    and, on the ba3c node, the off-policy corrected algorithms."""
    res = ddrl("train", JOBS / "cartpole.toml", "--out", run_dir, "--set", f"acting.mode={mode}",
               "--set", f"algo.name={algo}", "--set", "algo.epochs=2", "--set",
               "algo.minibatches=2", "--set", f"run.max_frames={CARTPOLE_BUDGET}", timeout=240)
    assert res.returncode == 0, res.stderr
    assert_solved(run_dir, f"{mode} {algo}")
    assert "stopped (target)" in res.stdout
    train = table(run_dir, "train")
    assert len(train) and np.all(np.diff(train["update"]) > 0)
    assert train["frames"][-1] <= CARTPOLE_BUDGET + 1000
    assert (train["policy_lag"] >= 0).all()
    if algo in ("vtrace", "appo"):  # the acting policy's log-probabilities reached the loss
        assert np.isfinite(train["approx_kl"]).all() and (train["approx_kl"] >= 0).all()
    if (mode, algo) == ("ba3c", "a2c"):
        # Training goes on while the evaluator plays, so the last checkpoint may have regressed;
        # the best-evaluated weights are the ones that reached the target.
        last = ddrl("eval", run_dir, "--episodes", "3", timeout=120)
        assert last.returncode == 0, last.stderr
        assert re.search(r"mean (\d+\.\d+) .* over 3 episodes", last.stdout), last.stdout
        best = ddrl("eval", run_dir, "--best", "--episodes", "5", timeout=120)
        assert best.returncode == 0, best.stderr
        assert "best.npz" in best.stdout, best.stdout
        assert float(re.search(r"mean (\d+\.\d+)", best.stdout).group(1)) >= 200, best.stdout
        # A pole kept up for hundreds of steps is pushed both ways.
        shares = dict(re.findall(r"(\d) (\d+\.\d)%", best.stdout.split("actions: ")[1]))
        assert set(shares) == {"0", "1"}, best.stdout
        assert abs(sum(map(float, shares.values())) - 100) < 0.2, best.stdout


def test_first_logged_game_includes_the_random_start():
    """Start-state decorrelation plays the first moves of each simulator's first game: the
    logged length and return are the whole game's, not what was left of it afterwards."""
    from ddrl.config import load_config
    from ddrl.envs import make_pool

    n = 4
    pool = make_pool(load_config(JOBS / "pong.toml", ["env.decorrelate=300"]), n, seed=3,
                     train=True)
    rng = np.random.default_rng(3)
    seen_steps, seen_return = np.zeros(n, int), np.zeros(n)
    first: dict[int, tuple[float, int, int, float]] = {}
    try:
        while len(first) < n:
            step = pool.recv()
            seen_steps[step.env_ids] += 1
            seen_return[step.env_ids] += step.reward
            for env, ret, length in step.episodes:
                first.setdefault(env, (ret, length, seen_steps[env], seen_return[env]))
            pool.send(rng.integers(0, pool.n_actions, len(step.env_ids)))
    finally:
        pool.close()
    for env, (ret, length, steps, _) in first.items():
        assert length > steps, f"simulator {env}: the random start is missing from its game"
        assert -21 <= ret <= 21
    assert any(ret != seen for ret, _, _, seen in first.values()), \
        "no point scored during the random start was counted"


@pytest.mark.newest_stack
def test_pong_log_readable_while_running(run_dir):
    """A real Pong run: a second process reads /train, /episodes and /eval rows mid-run; the
    run is then stopped by SIGTERM (so the test waits on rows, not on a clock) and the log it
    leaves has those rows and the root attributes. With an evaluation every 5 updates the
    background evaluator is nearly always mid-game when the signal comes: that once ended the
    process in an abort at interpreter exit (status 134), not in EXIT_SIGNALLED."""
    cmd = [*DDRL, "train", JOBS / "pong.toml", "--out", run_dir,
           "--set", "model.arch=a3c", "--set", "acting.n_sim=4", "--set", "env.decorrelate=400",
           "--set", "run.max_minutes=10", "--set", "eval.every=5", "--set", "eval.episodes=1",
           "--set", "eval.nice=0", "--set", "run.log_every=2"]
    proc = subprocess.Popen([str(c) for c in cmd], cwd=ROOT, env=env_for_tests(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = {}
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if (run_dir / "log.h5").exists():
                with h5py.File(run_dir / "log.h5", "r", swmr=True) as f:
                    seen = {name: f[name].shape[0] for name in ("train", "episodes", "eval")}
                if all(seen.values()):
                    break
            time.sleep(2)
        assert proc.poll() is None, "run ended before rows were seen"
        assert all(seen.values()), seen
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=200)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_SIGNALLED, out
    assert f"log {run_dir / 'log.h5'}" in out
    attrs = root_attrs(run_dir)
    # The log-format reference (generated from ROOT_ATTRIBUTES) names every attribute written.
    assert set(attrs) == set(ROOT_ATTRIBUTES), set(attrs) ^ set(ROOT_ATTRIBUTES)
    assert "ALE/Pong-v5" in attrs["config"]
    for name, rows in seen.items():
        assert len(table(run_dir, name)) >= rows, name
    episodes = table(run_dir, "episodes")
    assert (episodes["return"] >= -21).all() and (episodes["return"] <= 21).all()
    assert (run_dir / "config.toml").is_file()


@pytest.mark.newest_stack
def test_kill_and_resume_continues_the_log(run_dir):
    """SIGKILL after a checkpoint, then --resume: counters continue, no duplicated or
    missing update rows, the log stays readable, the restart is recorded."""
    args = ["train", JOBS / "cartpole.toml", "--out", run_dir, "--set", "run.log_every=1",
            "--set", "run.checkpoint_minutes=0.05", "--set", "eval.target=none",
            "--set", "eval.every=50", "--set", "eval.episodes=2"]
    proc = subprocess.Popen([*DDRL, *map(str, args), "--set", "run.max_frames=10000000"],
                            cwd=ROOT, env=env_for_tests(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list((run_dir / "checkpoints").glob("ckpt-*"))) < 2:
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert list((run_dir / "checkpoints").glob("ckpt-*")), "no checkpoint before the kill"
    before = table(run_dir, "train")["update"]
    ckpt_update = int(sorted((run_dir / "checkpoints").glob("ckpt-*"))[-1].stem.split("-")[1])
    assert before.max() >= ckpt_update, "rows up to the checkpoint were not flushed"

    res = ddrl(*args, "--resume", "--set", "run.max_frames=60000", timeout=180)
    assert res.returncode == 0, res.stderr
    assert f"resumed at update {ckpt_update}" in res.stdout
    updates = table(run_dir, "train")["update"]
    assert np.array_equal(updates, np.arange(1, len(updates) + 1)), "gap or duplicate in /train"
    assert updates[-1] > ckpt_update
    assert root_attrs(run_dir)["restarts"] == 1
    train = table(run_dir, "train")
    assert set(train["restart"][updates > ckpt_update]) == {1}
    # The live TensorBoard files say what the log says: the killed run's rows after its
    # checkpoint are replaced by the resumed run's.
    board = EventAccumulator(str(run_dir / "tensorboard"))
    board.Reload()
    assert [p.step for p in board.Scalars("train/loss")] == list(train["frames"])
    np.testing.assert_allclose([p.value for p in board.Scalars("train/loss")], train["loss"])
    assert np.all(np.diff(train["frames"]) >= 0) and np.all(np.diff(train["wall_time"]) >= 0)


def test_eval_writes_whole_games_as_a_video(run_dir, tmp_path):
    """A few Pong updates, then `ddrl eval --video`: one whole game (21 points lost or won)
    as an animated GIF of the agent's frames; the same game on the game's colour screen as a
    GIF and an MP4 cut at 2 s."""
    res = ddrl("train", JOBS / "pong-ppo.toml", "--out", run_dir, "--set", "run.max_frames=8000",
               *NO_EVAL, timeout=300)
    assert res.returncode == 0, res.stderr
    gif = tmp_path / "pong.gif"
    res = ddrl("eval", run_dir, "--video", gif, "--video-view", "agent", timeout=300)
    assert res.returncode == 0, res.stderr
    returns = [float(r) for r in re.search(r"wrote 1 game\(s\) to \S+, returns (\S+)$", res.stdout,
                                           re.M).group(1).split()]
    assert len(returns) == 1 and -21 <= returns[0] <= 21
    with Image.open(gif) as video:
        # A game lasts at least 21 points of about 30 agent steps each.
        assert video.n_frames > 500 and video.size == (192, 192)
        first = np.asarray(video.convert("L"))
        video.seek(video.n_frames // 2)
        assert (np.asarray(video.convert("L")) != first).any(), "the frames do not move"

    # The screen's own emulator plays the same game: the same return, checked step by step
    # inside. Bounded videos: their first 2 s (30 agent steps), the game still played out.
    for name in ("short.gif", "short.mp4"):
        short = ddrl("eval", run_dir, "--video", tmp_path / name, "--video-minutes",
                     str(2 / 60), timeout=300)
        assert short.returncode == 0, short.stderr
        assert f"wrote 1 game(s) to {tmp_path / name}, returns {returns[0]:+.0f}" \
            in short.stdout, short.stdout
        assert "--video holds the first" in short.stderr
    with Image.open(tmp_path / "short.gif") as video:
        assert video.size == (160, 210)
        # Pillow merges a run of identical frames into one of their summed duration.
        durations = []
        for frame in range(video.n_frames):
            video.seek(frame)
            durations.append(video.info["duration"])
        # GIF durations are whole hundredths: 30 frames of 67 ms are written as 60 or 70.
        assert video.n_frames <= 30 and 1700 <= sum(durations) <= 2100, durations
        assert _colourful(video.convert("RGB"))
    frames = imageio_ffmpeg.read_frames(str(tmp_path / "short.mp4"))
    meta = next(frames)
    assert meta["size"] == (320, 420) and meta["fps"] == 15, meta
    pictures = [np.frombuffer(f, np.uint8).reshape(420, 320, 3) for f in frames]
    assert len(pictures) == 30 and _colourful(Image.fromarray(pictures[15]))

    wrong = ddrl("eval", run_dir, "--video", tmp_path / "pong.avi", timeout=60)
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines() == [
        f"ddrl: error: --video {tmp_path / 'pong.avi'}: the video is written as MP4 or GIF; "
        "name it FILE.mp4 or FILE.gif"]


def _colourful(image: Image.Image) -> bool:
    """Pong's screen: an orange-brown field, not shades of grey."""
    rgb = np.asarray(image, np.int16)
    return bool((np.abs(rgb[..., 0] - rgb[..., 2]) > 60).mean() > 0.5)


@pytest.mark.parametrize("groups", [1, 3])
def test_a2c_node_steps_its_simulators_in_any_number_of_groups(groups):
    """`acting.groups` splits the a2c node's simulators into that many alternating groups: one
    rollout holds every simulator's t_max steps whatever the split, and the same seed and
    split replay the same rollout."""
    from ddrl.acting.a2c import A2CActors
    from ddrl.config import load_config
    from ddrl.envs import env_spec
    from ddrl.learner import Learner

    cfg = load_config(JOBS / "cartpole.toml", ["acting.mode=a2c", "acting.n_sim=6",
                                               "acting.t_max=4", f"acting.groups={groups}"])
    learner = Learner(cfg, *env_spec(cfg))
    batches = []
    for _ in range(2):
        actors = A2CActors(cfg, learner, rank=0, restart=0)
        try:
            assert len(actors.pools) == groups
            batches.append(actors._rollout())
        finally:
            actors.close()
    first, again = batches
    assert len(first) == 6 * 4 and first.obs.shape == (24, *env_spec(cfg)[0])
    np.testing.assert_array_equal(first.obs, again.obs)
    np.testing.assert_array_equal(first.actions, again.actions)
