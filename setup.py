"""setup.cfg holds the metadata; this adds the recipes (jobs/) to the built package as
ddrl/recipes/, so that an installed ddrl runs `ddrl train pong-ppo` (ddrl/recipe.py)."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithRecipes(build_py):
    def run(self) -> None:
        super().run()
        jobs = Path(__file__).resolve().parent / "jobs"
        target = Path(self.build_lib) / "ddrl" / "recipes"
        target.mkdir(parents=True, exist_ok=True)
        for job in sorted(jobs.iterdir()):
            if job.suffix in (".toml", ".sweep"):
                shutil.copy2(job, target / job.name)


setup(cmdclass={"build_py": BuildWithRecipes})
