"""Recipes by name (ddrl/recipe.py): the checkout's jobs/ here; the wheel's copy is
tests/test_install.py's."""
from __future__ import annotations

from pathlib import Path

from ddrl import recipe
from ddrl.cli import build_parser

JOBS = Path(__file__).resolve().parents[2] / "jobs"


def test_a_name_is_its_recipe_and_a_path_stays_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert recipe.resolve("pong-ppo") == str(JOBS / "pong-ppo.toml")
    assert recipe.resolve("pong-ppo.toml") == str(JOBS / "pong-ppo.toml")
    assert recipe.resolve("six-games") == str(JOBS / "six-games.sweep")
    # A file of that name here comes first; a path is never looked up; nor is an unknown name.
    (tmp_path / "pong-ppo.toml").write_text("")
    assert recipe.resolve("pong-ppo.toml") == "pong-ppo.toml"
    assert recipe.resolve("sub/pong-ppo.toml") == "sub/pong-ppo.toml"
    assert recipe.resolve("no-such-recipe") == "no-such-recipe"


def test_every_job_file_is_listed_with_a_line(capsys):
    argv = ["recipes"]
    args = build_parser(argv).parse_args(argv)
    assert recipe.run(args) == 0
    lines = capsys.readouterr().out.splitlines()
    names = sorted(p.stem for p in JOBS.iterdir() if p.suffix in (".toml", ".sweep"))
    assert [line.split()[0] for line in lines] == names
    assert all(len(line.split(maxsplit=1)) == 2 and len(line) <= 120 for line in lines), lines


def test_train_and_slurm_take_a_recipe_by_name():
    for argv in (["train", "cartpole"], ["slurm", "cartpole"]):
        assert build_parser(argv).parse_args(argv).job == str(JOBS / "cartpole.toml")


def test_a_sweep_file_by_name_too():
    argv = ["sweep", "atari-ppo", "--sweep", "six-games", "--out", "runs/six"]
    args = build_parser(argv).parse_args(argv)
    assert (args.job, args.sweep) == (str(JOBS / "atari-ppo.toml"), str(JOBS / "six-games.sweep"))
