"""Recipes: the job files of `jobs/` by name, so a `pip install` user can run
`ddrl train pong-ppo` and `ddrl slurm pong-ppo` without a checkout. A wheel carries them as
`ddrl/recipes/` (copied from `jobs/` at build time, setup.py); an editable install or a
checkout reads `jobs/` itself. `ddrl recipes` lists them."""
from __future__ import annotations

import argparse
from pathlib import Path

SUFFIXES = (".toml", ".sweep")


def places() -> list[Path]:
    """Where recipes are: the installed package's copy, then the checkout's jobs/."""
    package = Path(__file__).resolve().parent
    return [p for p in (package / "recipes", package.parent / "jobs") if p.is_dir()]


def available() -> dict[str, Path]:
    """Each recipe's name (its file name without the suffix) and file, the first place
    first."""
    found: dict[str, Path] = {}
    for place in places():
        for path in sorted(place.iterdir(), key=lambda p: p.stem):
            if path.suffix in SUFFIXES:
                found.setdefault(path.stem, path)
    return found


def resolve(job: str) -> str:
    """`job` as given when it is a file (or looks like a path), else the recipe of that name
    (`pong-ppo`, or `pong-ppo.toml` away from the checkout); unknown names are left for the
    command to report as a missing job file."""
    path = Path(job)
    if path.is_file() or len(path.parts) > 1:
        return job
    recipe = available().get(path.stem if path.suffix in SUFFIXES else job)
    return str(recipe) if recipe is not None else job


def summary(path: Path, width: int = 90) -> str:
    """The first sentence of the file's leading comment, cut to `width` characters."""
    words = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        words += line.lstrip("#").split()
    text = " ".join(words)
    sentence = text.split(". ")[0].split(": ")[0]
    return sentence if len(sentence) <= width else sentence[:width - 3].rstrip() + "..."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--paths", action="store_true", help="print each recipe's file too")


def run(args: argparse.Namespace) -> int:
    recipes = available()
    width = max((len(name) for name in recipes), default=0)
    for name, path in recipes.items():
        where = f"  ({path})" if args.paths else ""
        print(f"{name.ljust(width)}  {summary(path)}{where}")
    return 0
