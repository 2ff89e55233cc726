"""Legend labels for `ddrl analyze`: what differs, or the run names when too much does."""
from __future__ import annotations

from pathlib import Path

from analysis.comparison import setting_keys
from analysis.load import Run
from analysis.summary import MAX_LABEL_KEYS, config_differences, run_labels


def run(name: str, ranks: int = 2, **sections: dict) -> Run:
    return Run(Path(name), name, sections, {"world_size": ranks})


def test_labels_name_the_keys_that_differ():
    runs = [run("a", optim={"lr": 1e-3}), run("b", optim={"lr": 5e-4}, ranks=4)]
    assert run_labels(runs) == ["optim.lr=0.001, ranks=2", "optim.lr=0.0005, ranks=4"]


def test_repeats_of_one_configuration_are_told_apart_by_name():
    runs = [run("s0", optim={"lr": 1e-3}), run("s1", optim={"lr": 1e-3})]
    assert run_labels(runs) == ["s0", "s1"]
    runs = [run("s0", run={"seed": 0}), run("s1", run={"seed": 0}), run("x", run={"seed": 1})]
    assert run_labels(runs) == ["s0: run.seed=0", "s1: run.seed=0", "x: run.seed=1"]


def test_runs_of_different_jobs_are_labelled_by_name():
    many = {f"k{i}": i for i in range(MAX_LABEL_KEYS + 1)}
    runs = [run("pong-paper", node=many), run("pong-ppo", node={k: -1 for k in many})]
    assert run_labels(runs) == ["pong-paper", "pong-ppo"]


def test_keys_of_bookkeeping_do_not_make_a_setting():
    """One sweep line run with a longer time limit on a slower CPU, checkpointed more often and
    its replay memory saved, is still the same setting as its other seeds."""
    runs = [run("abl_2", run={"seed": 0, "max_minutes": 150}, dqn={"atoms": 51}),
            run("abl_8", run={"seed": 1, "checkpoint_minutes": 3.0},
                dqn={"atoms": 51, "save_replay": True}),
            run("abl_0", run={"seed": 0, "max_minutes": 60}, dqn={"atoms": 0})]
    assert config_differences(runs) == ["dqn.atoms", "run.seed"]
    assert setting_keys(runs) == ["dqn.atoms"]
    assert run_labels(runs[:2]) == ["run.seed=0", "run.seed=1"]


def test_runs_of_two_sweeps_are_named_by_their_sweep_too(tmp_path):
    """`ddrl status` and `ddrl analyze` of two sweeps: every sweep has a `seed_0`."""
    from analysis.load import run_names

    for run_dir in ("a/seed_0", "b/seed_0", "b/seed_1", "c/x/solo"):
        (tmp_path / run_dir).mkdir(parents=True)
        (tmp_path / run_dir / "log.h5").touch()
    (tmp_path / "old.h5").touch()
    assert run_names([tmp_path / "b/seed_0", tmp_path / "b/seed_1"]) == ["seed_0", "seed_1"]
    assert run_names([tmp_path / "a/seed_0", tmp_path / "b/seed_0", tmp_path / "b/seed_1",
                      tmp_path / "c/x/solo"]) == ["a/seed_0", "b/seed_0", "b/seed_1", "x/solo"]
    assert run_names([tmp_path / "old.h5", tmp_path / "c/x/solo"]) == ["old", "solo"]
