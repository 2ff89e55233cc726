"""`ddrl analyze` and the analysis package, on logs of real short CartPole training runs."""
from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest
from matplotlib.image import imread

from analysis.comparison import plot_settings, setting_keys
from analysis.games import game_table, plot_games
from analysis.load import load_run, load_runs
from analysis.plots import plot_learning_curves, plot_losses, plot_ranks, plot_scaling
from analysis.reference import load_reference
from analysis.scaling import scaling_table
from analysis.scores import human_normalized
from analysis.summary import run_labels, summarize
from ddrl.errors import DdrlError
from ddrl.rundir import checkpoint

REPO = Path(__file__).resolve().parents[1]
JOB = "jobs/cartpole.toml"
FRAMES = 30_000
# The two runs differ in this one value, so labels and the sweep figure come from it.
SWEEP = ("optim.lr", ["0.001", "0.003"])
TARGET = 100.0
# What every run of these tests shares.
RUN_SETS = ["--set", f"run.max_frames={FRAMES}", "--set", f"eval.target={TARGET}"]
# One worker of `pytest -n` (Makefile) takes the whole module, so its runs train once.
pytestmark = pytest.mark.xdist_group("analysis")


def ddrl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddrl", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory) -> list[Path]:
    """Two short real training runs (sequential: the test machine has few cores), each with
    the target the figures are drawn at (TARGET): the job's own, 400, was confirmed within
    FRAMES by one run in two or none, as the threads' timing had it."""
    base = tmp_path_factory.mktemp("runs")
    dirs = []
    for i, value in enumerate(SWEEP[1]):
        out = base / f"run{i}"
        proc = ddrl("train", JOB, "--out", str(out), *RUN_SETS, "--set", f"{SWEEP[0]}={value}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        dirs.append(out)
    return dirs


@pytest.fixture(scope="module")
def runs(run_dirs):
    return load_runs(run_dirs)


def raw(run_dir: Path, table: str) -> np.ndarray:
    """A table as the file holds it; /eval in the order of the weights, as the analysis reads
    it: when an evaluation reaches eval.target, the weights skipped while the evaluator was
    busy (more of them on a loaded machine) are played after it, their rows last."""
    with h5py.File(run_dir / "log.h5", "r", swmr=True) as f:
        rows = f[table][:]
    return rows[np.argsort(rows["update"], kind="stable")] if table == "eval" else rows


def raw_max(run_dir: Path, column: str, tables=("train", "episodes", "eval")) -> int:
    """The largest value of a column in the global tables (/ranks counts per-rank frames)."""
    return max(int(raw(run_dir, t)[column].max()) for t in tables if len(raw(run_dir, t)))


def test_summary_one_row_per_run_with_logged_frames(run_dirs, runs):
    summary = summarize(runs)
    assert list(summary["run"]) == [d.name for d in run_dirs]
    for row, run_dir in zip(summary.itertuples(), run_dirs):
        assert row.frames == raw_max(run_dir, "frames")
        # A run stops at max_frames, or earlier once an evaluation reaches eval.target.
        assert row.frames >= FRAMES or row.best_eval >= row.target
        assert row.updates == raw_max(run_dir, "update", ("train", "eval"))
        assert row.wall_time > 0 and row.dp_per_s > 0
        assert row.game == "CartPole" and math.isnan(row.hns_best)
    # The only config difference becomes a column, with each run's own value.
    assert [f"{v:g}" for v in summary[SWEEP[0]]] == [f"{float(v):g}" for v in SWEEP[1]]


def test_time_to_target_is_first_eval_row_at_or_above(run_dirs, runs):
    evals = raw(run_dirs[0], "eval")
    assert len(evals) >= 2, "the CartPole job should evaluate several times in a short run"
    # A target that some, but usually not the first, evaluation reaches.
    target = float(np.median(evals["mean_return"]))
    first = evals[np.flatnonzero(evals["mean_return"] >= target)[0]]
    row = summarize(runs[:1], target=target).iloc[0]
    assert row.time_to_target == pytest.approx(first["wall_time"])
    assert row.frames_to_target == first["frames"]
    assert row.best_eval == pytest.approx(evals["mean_return"].max())
    assert row.last_eval == pytest.approx(evals["mean_return"][-1])
    games = raw(run_dirs[0], "episodes")
    # Games that end at the same frame count keep the log's order (np.sort's `order` would
    # break such ties by the other fields, the return among them).
    last = games["return"][np.argsort(games["frames"], kind="stable")][-100:]
    assert len(games) > 100 and row.online_last100 == pytest.approx(last.mean())
    never = summarize(runs[:1], target=float(evals["mean_return"].max()) + 1).iloc[0]
    assert math.isnan(never.time_to_target) and math.isnan(never.frames_to_target)


def test_cli_writes_summary_csv_and_valid_pngs(run_dirs, tmp_path):
    evals = raw(run_dirs[0], "eval")
    target = float(evals["mean_return"].min())
    proc = ddrl("analyze", *map(str, run_dirs), "--target", str(target), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    csv = pd.read_csv(tmp_path / "summary.csv")
    assert list(csv["frames"]) == [raw_max(d, "frames") for d in run_dirs]
    assert csv["time_to_target"].iloc[0] == pytest.approx(evals["wall_time"][0])
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert {"curves.png", "losses.png", f"throughput-{SWEEP[0]}.png"} <= set(pngs)
    for name in pngs:
        image = imread(tmp_path / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 0, f"{name} is blank"


def test_curves_have_one_line_per_run_and_config_labels(runs):
    labels = run_labels(runs)
    assert labels == [f"{SWEEP[0]}={float(v)}" for v in SWEEP[1]]
    fig = plot_learning_curves(runs, labels, target=TARGET)
    axes = np.array(fig.axes).reshape(2, 2)
    summary = summarize(runs, target=TARGET)
    confirmed = summary["frames_to_confirmed"].notna().sum()
    online = summary["frames_to_online"].notna().sum()
    assert confirmed >= 1  # so that the stars are checked
    for col in range(2):
        # Eval: mean and max per run, the target line, a star per run that confirmed it;
        # online score: one per run, a star per run whose online mean reached it.
        assert len(axes[0, col].lines) == 2 * len(runs) + 1 + confirmed
        assert len(axes[1, col].lines) == len(runs) + online
        assert axes[0, col].get_legend_handles_labels()[1] == labels
    losses = plot_losses(runs, labels)
    for ax in losses.axes:
        assert len(ax.lines) == len(runs)
        np.testing.assert_array_equal(ax.lines[0].get_xdata(), runs[0]["train"]["frames"])


def test_rank_figure_has_one_throughput_line_per_rank(runs):
    run = runs[0]
    fig = plot_ranks(run)
    assert len(fig.axes[0].lines) == run["ranks"]["rank"].nunique() >= 1


def test_scaling_ideal_line_and_efficiency(runs):
    # Two single-rank runs stand in for 1 and 4 workers: the arithmetic is what is tested.
    summary = summarize(runs, target=float(runs[0]["eval"]["mean_return"].min()))
    summary["workers"] = [1, 4]
    summary["time_to_target"] = [400.0, 200.0]
    table = scaling_table(summary)
    assert list(table["ideal"]) == [400.0, 100.0]
    assert list(table["efficiency"]) == [1.0, 0.5]
    for ax in plot_scaling(summary).axes:  # measured and ideal, once each
        labels = ax.get_legend_handles_labels()[1]
        assert len(labels) == 2 and "ideal linear" in labels


def test_game_table_takes_medians_and_ranges_over_each_games_seeds():
    rows = [("Pong", 18.0, 20.0, 6e6, 1200.0), ("Pong", 19.0, 21.0, 8e6, 1500.0),
            ("Pong", 10.0, 12.0, math.nan, math.nan),
            ("Breakout", 30.5, 40.0, math.nan, math.nan), ("Breakout", 1.7, 5.0, math.nan, math.nan)]
    summary = pd.DataFrame(rows, columns=["game", "last_eval", "best_eval", "frames_to_target",
                                          "time_to_target"])
    summary["target"], summary["frames"], summary["wall_time"] = 18.0, 1e7, 1800.0
    summary["online_last100"] = [15.0, 17.0, 5.0, 20.0, 2.0]
    table = game_table(summary).set_index("game")
    pong, breakout = table.loc["Pong"], table.loc["Breakout"]
    assert (pong["final"], pong["final_min"], pong["final_max"]) == (18.0, 10.0, 19.0)
    assert pong["best"] == 20.0 and pong["reached"] == "2/3"
    assert pong["frames_to_target"] == 7e6 and pong["minutes_to_target"] == pytest.approx(22.5)
    assert pong["hns_final"] == pytest.approx(human_normalized(18.0, "Pong"))
    assert (pong["paper"], pong["ppo_40m"]) == (20.0, 20.7)
    # Against the best held action (Pong -21.0, Breakout LEFT 1.8): Breakout's 1.7 is below.
    assert (pong["held"], pong["above_held"]) == (-21.0, "3/3")
    assert (breakout["held"], breakout["above_held"]) == (1.8, "1/2")
    assert pong["online_last100"] == 15.0 and breakout["online_last100"] == 11.0
    # Breakout's two seeds: HNS 1.0 and 0.0, median 0.5; no target reached.
    assert breakout["hns_final"] == pytest.approx(0.5) and breakout["reached"] == "0/2"
    assert math.isnan(breakout["frames_to_target"])
    assert table.loc["median", "hns_final"] == pytest.approx(
        np.median([pong["hns_final"], 0.5]))
    summary.loc[summary["game"] == "Breakout", "target"] = math.nan
    assert game_table(summary).set_index("game").loc["Breakout", "reached"] == "-"
    summary.loc[summary["game"] == "Breakout", "game"] = "Qbert"  # no held score measured
    qbert = game_table(summary).set_index("game").loc["Qbert"]
    assert math.isnan(qbert["held"]) and qbert["above_held"] == "-"


def test_runs_of_several_games_get_a_table_and_a_grid_per_game(run_dirs, tmp_path):
    other = tmp_path / "acrobot"
    res = ddrl("train", JOB, "--out", str(other), "--set", "env.id=Acrobot-v1",
               "--set", "run.max_frames=3000", "--set", "eval.target=none", "--set", "eval.every=20")
    assert res.returncode == 0, res.stderr[-2000:]
    res = ddrl("analyze", str(run_dirs[0]), str(run_dirs[1]), str(other), "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "per game, over its seeds" in res.stdout
    games = pd.read_csv(tmp_path / "a" / "games.csv")
    assert games["game"].tolist() == ["Acrobot", "CartPole", "median"]
    assert games.set_index("game").loc["CartPole", "seeds"] == 2
    assert imread(tmp_path / "a" / "games.png").shape[0] > 100


def test_game_grid_legend_names_what_differs_among_a_games_runs(runs):
    # Two CartPole runs that differ in the learning rate: the legend says so, not "seed 0" twice.
    (ax,) = [a for a in plot_games(runs).axes if a.get_visible()]
    assert ax.get_legend_handles_labels()[1] == run_labels(runs)
    (ax,) = [a for a in plot_games(runs[:1]).axes if a.get_visible()]
    assert ax.get_legend_handles_labels()[1] == [f"run.seed={runs[0].setting('run.seed')}"]


def test_settings_repeated_over_seeds_get_a_row_and_a_colour_each(run_dirs, runs, tmp_path):
    # A second seed of the first run's setting: two settings, one of them repeated.
    repeat = tmp_path / "run0-seed1"
    res = ddrl("train", JOB, "--out", str(repeat), *RUN_SETS,
               "--set", f"{SWEEP[0]}={SWEEP[1][0]}", "--set", "run.seed=1")
    assert res.returncode == 0, res.stderr[-2000:]
    assert setting_keys(runs) is None  # one run per setting: nothing to group
    dirs = [run_dirs[0], run_dirs[1], repeat]
    res = ddrl("analyze", *map(str, dirs), "--out", str(tmp_path / "a"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "per setting, over its seeds" in res.stdout
    table = pd.read_csv(tmp_path / "a" / "settings.csv")
    assert table[SWEEP[0]].tolist() == [float(v) for v in SWEEP[1]]
    assert table["seeds"].tolist() == [2, 1]
    finals = [float(raw(d, "eval")["mean_return"][-1]) for d in dirs]
    assert table["final"].tolist() == pytest.approx([np.median(finals[::2]), finals[1]])
    assert table["final_min"][0] == pytest.approx(min(finals[::2]))
    both = load_runs(dirs)
    keys = setting_keys(both)
    assert keys == [SWEEP[0]]
    for ax in plot_settings(both, keys).axes:  # a line per run, a legend entry per setting
        assert len(ax.get_lines()) == 3
        assert ax.get_legend_handles_labels()[1] == [f"{SWEEP[0]}={v}" for v in SWEEP[1]]
    assert imread(tmp_path / "a" / "settings.png").shape[0] > 100


def test_human_normalized_score_uses_published_baselines():
    assert human_normalized(30.5, "Breakout") == pytest.approx(1.0)
    assert human_normalized(-20.7, "Pong") == pytest.approx(0.0)
    assert math.isnan(human_normalized(100.0, "CartPole"))


def _wait_for_rows(run_dir: Path, deadline: float):
    while time.monotonic() < deadline:
        try:
            run = load_run(run_dir)
            if len(run["train"]):
                return run
        except DdrlError:
            pass  # the log is not created yet, or its writer has not switched to SWMR yet
        time.sleep(1.0)
    raise AssertionError("the training job logged no rows in time")


def test_analyze_while_the_job_runs_and_after_it_is_killed(tmp_path):
    out = tmp_path / "live"
    err = tmp_path / "train.err"
    # No target, so the job cannot stop early by solving CartPole while we look at it.
    cmd = [sys.executable, "-m", "ddrl", "train", JOB, "--out", str(out),
           "--set", "run.max_frames=100000000", "--set", "eval.target=none"]
    with err.open("w") as stderr:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr,
                                start_new_session=True)
    try:
        seen = _wait_for_rows(out, time.monotonic() + 300)
        assert proc.poll() is None, f"the job should still be running: {err.read_text()[-2000:]}"
        live = ddrl("analyze", str(out), "--out", str(tmp_path / "a1"))
        assert live.returncode == 0, live.stderr
        assert (tmp_path / "a1" / "curves.png").is_file()
    finally:
        # Kill the job's own process group: a killed writer must leave a readable log.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    after = ddrl("analyze", str(out), "--out", str(tmp_path / "a2"))
    assert after.returncode == 0, after.stderr
    assert load_run(out).progress().frames >= seen.progress().frames > 0


@pytest.mark.parametrize("make", ["missing", "not_hdf5", "foreign_hdf5", "dir_without_log"])
def test_bad_input_is_a_one_line_error(tmp_path, make):
    path = {"missing": Path("/nonexistent"), "not_hdf5": tmp_path / "log.h5",
            "foreign_hdf5": tmp_path / "other.h5", "dir_without_log": tmp_path}[make]
    if make == "not_hdf5":
        path.write_text("not a log\n")
    if make == "foreign_hdf5":
        with h5py.File(path, "w") as f:
            f.create_dataset("x", data=[1, 2, 3])
    proc = ddrl("analyze", str(path), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddrl: error:"), proc.stderr
    assert str(path) in lines[0] or path.name in lines[0]


def test_shipped_references_are_drawn_beside_the_eval_curve(runs, tmp_path):
    pong = load_reference("pong")
    assert {"RLlib PPO", "CleanRL PPO"} <= set(pong["label"])
    labels = run_labels(runs)
    fig = plot_learning_curves(runs, labels, references=pong)
    ax = np.array(fig.axes).reshape(2, 2)[0, 0]
    # Beside each run's mean and max, and a star where a run's target was confirmed.
    curves = [line for line in ax.lines if line.get_marker() != "*"]
    assert len(curves) == 2 * len(runs) + pong["label"].nunique()
    assert set(pong["label"]) <= set(ax.get_legend_handles_labels()[1])
    own = tmp_path / "mine.csv"
    own.write_text("label,frames,score\nmy paper,1000,50\nmy paper,2000,150\n")
    proc = ddrl("analyze", *map(str, [runs[0].path]), "--reference", str(own),
                "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "curves.png").is_file()


@pytest.mark.parametrize("text, message", [
    ("label,frames\nx,1\n", "missing column(s) score (expected label,frames,score)"),
    ("label,frames,score\nx,1,lots\n", "row 1: score is not a number"),
])
def test_bad_reference_is_a_one_line_error(tmp_path, runs, text, message):
    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    proc = ddrl("analyze", str(runs[0].path), "--reference", str(bad), "--out", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"ddrl: error: --reference {bad}: {message}"]


def test_export_writes_the_log_as_tensorboard_scalars(run_dirs, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = ddrl("export", "--tensorboard", str(tmp_path / "tb"), str(run_dirs[0]))
    assert proc.returncode == 0, proc.stderr
    acc = EventAccumulator(str(tmp_path / "tb" / run_dirs[0].name))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/entropy", "eval/mean_return", "episodes/return"} <= tags
    # A2C has no approximate KL: NaN figures are left out, not written as NaN.
    assert "train/approx_kl" not in tags
    evals = raw(run_dirs[0], "eval")
    points = acc.Scalars("eval/mean_return")
    assert [p.step for p in points] == list(evals["frames"])
    np.testing.assert_allclose([p.value for p in points], evals["mean_return"], rtol=1e-6)
    start = points[0].wall_time - float(evals["wall_time"][0])
    np.testing.assert_allclose([p.wall_time - start for p in points], evals["wall_time"],
                               atol=1e-3)


def test_export_of_runs_whose_names_collide_stays_inside_its_directory(run_dirs, tmp_path):
    """Two runs both named `run0` (the same directory name under two parents)."""
    other = tmp_path / "elsewhere" / run_dirs[0].name
    shutil.copytree(run_dirs[0], other)
    tb = tmp_path / "tb"
    # The runs' own live event files (RUN_DIR/tensorboard/) are there before the export.
    before = set(tmp_path.rglob("events.out.tfevents.*"))
    proc = ddrl("export", "--tensorboard", str(tb), str(run_dirs[0]), str(other))
    assert proc.returncode == 0, proc.stderr
    written = set(tmp_path.rglob("events.out.tfevents.*")) - before
    assert len(written) == 2 and all(tb in p.parents for p in written), written


def start_endless_run(out: Path) -> subprocess.Popen:
    """A CartPole run with no end of its own, once its log has 3 /train rows."""
    train = subprocess.Popen([sys.executable, "-m", "ddrl", "train", JOB, "--out", str(out),
                              "--set", "run.max_frames=100000000", "--set", "eval.target=none"],
                             cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not ((out / "log.h5").exists() and len(raw(out, "train")) >= 3):
        if time.monotonic() > deadline or train.poll() is not None:
            train.kill()
            pytest.fail(f"the run in {out} did not log 3 /train rows in 120 s")
        time.sleep(0.5)
    return train


def test_status_says_where_each_run_stands(run_dirs, tmp_path):
    proc = ddrl("status", str(run_dirs[0].parent))  # a directory of runs
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split()[:3] == ["run", "state", "frames"] and len(lines) == 3, lines
    # Each ended at its frame budget or at CartPole's target (then with a time to it).
    for line in lines[1:]:
        cells = line.split()
        assert cells[1] == "finished" and ("(100%)" in line or cells[-3] != "-"), lines
    # Cut while it played the weights it owed at its end: not finished, a resume plays them.
    owing = tmp_path / "owing"
    shutil.copytree(run_dirs[0], owing)
    final = checkpoint.load(checkpoint.latest(owing / "checkpoints"))
    checkpoint.save_unplayed(owing / "checkpoints", [final] * 3)
    cells = ddrl("status", str(owing)).stdout.splitlines()[1].split()
    assert cells[1] == "stopped" and cells[-2:] == ["3", "evals"], cells
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dirs[0], damaged)
    (damaged / "log.h5").write_bytes(b"\0" * 4096)
    live = tmp_path / "live"
    train = start_endless_run(live)
    try:
        proc = ddrl("status", str(live), str(damaged))
    finally:
        train.send_signal(signal.SIGTERM)
        train.wait(timeout=120)
    assert proc.returncode == 0, proc.stderr
    running, broken = proc.stdout.splitlines()[1:]
    assert running.split()[:2] == ["live", "running"] and ":" in running.split()[-1], running
    assert broken.split()[:2] == ["damaged", "damaged"], broken
    after = ddrl("status", str(live)).stdout.splitlines()[1]
    assert after.split()[1] == "stopped" and after.split()[-1] == "-", after
    # The batch script requeued its job (launch.sh marks it); the resumed run has not yet
    # rewritten the log.
    (live / "requeued").write_text("4242\n")
    after = ddrl("status", str(live)).stdout.splitlines()[1]
    assert after.split()[1] == "requeued", after


def test_status_tells_a_killed_run_from_a_stopped_one(tmp_path):
    """SIGKILL (the OOM killer, a session or node gone): the log stays flagged as open, and
    the run stands where its last checkpoint is, since a resume goes on from there."""
    killed = tmp_path / "killed"
    train = start_endless_run(killed)
    train.kill()
    train.wait(timeout=60)
    # Killed within seconds, long before its first checkpoint (every 10 minutes): a resume
    # starts from scratch, whatever the log holds.
    assert not (killed / "checkpoints").exists() or not any((killed / "checkpoints").iterdir())
    logged = int(raw(killed, "train")["frames"].max())
    cells = ddrl("status", str(killed)).stdout.splitlines()[1].split()
    assert cells[1] == "killed" and cells[2] == "0" and logged > 0, (cells, logged)
