"""Derived seeds stay in the range every backend takes, however late in a run they are drawn."""
from __future__ import annotations

import ale_py
import pytest

from ddrl.cli import main
from ddrl.seeding import SEED_LIMIT, derive_seed


def test_derived_seeds_stay_below_2_to_the_30_late_in_a_run_and_the_emulator_takes_them():
    # run.seed = 418 reached ale-py's limit (2^31 - 1) after ~70,500 updates when the update
    # was added to the seed; streams now name it.
    seeds = [derive_seed(run_seed, rank, f"eval/{update}")
             for run_seed in (0, 418, SEED_LIMIT - 1) for rank in (0, 63, 4095)
             for update in (0, 70_500, 10**9)]
    assert all(0 <= s < SEED_LIMIT for s in seeds) and SEED_LIMIT == 2**30
    assert len(set(seeds)) == len(seeds)
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", max(seeds))
    assert ale.getInt("random_seed") == max(seeds)


@pytest.mark.parametrize("seed", [-1, SEED_LIMIT])
def test_an_evaluation_seed_outside_the_range_is_refused_in_one_line(seed, tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--seed", str(seed)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ddrl: error: --seed {seed}: must be in [0, {SEED_LIMIT})"]
