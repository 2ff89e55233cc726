"""Config loading, coercion and validation, in-process."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddrl.config import Config, identity_changes, load_config
from ddrl.errors import DdrlError
from ddrl.placement import load_job

JOBS = Path(__file__).resolve().parents[2] / "jobs"


@pytest.mark.parametrize("job", sorted(JOBS.glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_job_loads(job):
    load_config(job)


def test_overrides_are_toml_literals_and_coerced():
    cfg = load_config(JOBS / "pong-ppo.toml", ["run.max_frames=2_000_000", "optim.lr=1", "algo.epochs=2"])
    assert cfg.run.max_frames == 2_000_000 and isinstance(cfg.run.max_frames, int)
    assert cfg.optim.lr == 1.0 and isinstance(cfg.optim.lr, float)
    assert cfg.algo.name == "ppo" and cfg.algo.epochs == 2


@pytest.mark.parametrize("override, message", [
    ("run.max_frames=2.5", "config key run.max_frames: expected an integer, got the float 2.5"),
    ("run.max_frames=1e99", "config key run.max_frames: expected an integer, got the float 1e+99"),
    ("run.max_frames=10**13", "config key run.max_frames: expected int"),
    ("run.max_frames=10_000_000_000_000", "config key run.max_frames: 10000000000000 is out of range"),
    ("acting.n_sim=100000", "config key acting.n_sim: 100000 is out of range (must be <= 4096)"),
    ("run.max_frames=1000", "config key run.max_frames: 1,000 is less than one rollout of one rank"),
    ("eval.episodes=0", "config key eval.target: 18 can never be reached with eval.episodes = 0"),
    ("algo.name=sac", "config key algo.name: 'sac' is not one of a2c, ppo, vtrace, appo, dqn"),
    ("algo.name=dqn", "config keys algo.name and acting.mode: DQN learns from a replay memory"),
    ("optim.optimizer=sgd", "config key optim.optimizer: 'sgd' is not one of adam, rmsprop"),
    ("algo.rho_clip=0", "config key algo.rho_clip: 0.0 is out of range (must be > 0.0)"),
    ("algo.gae_lambda=1.5", "config key algo.gae_lambda: 1.5 is out of range"),
    ("algo.minibatches=100000", "config key algo.minibatches: more minibatches than data points"),
    ("env.size=20", "config key env.size: 20 is out of range"),
    ("optim.max_grad_norm=-1", "config key optim.max_grad_norm: -1.0 is out of range"),
    ("algo.bogus=1", "unknown config key 'algo.bogus'"),
    ("run.seed=-1", "config key run.seed: -1 is out of range (must be >= 0)"),
    ("optim.beta1=1.0", "config key optim.beta1: 1.0 is out of range (must be < 1)"),
    ("optim.beta2=1.0", "config key optim.beta2: 1.0 is out of range (must be < 1)"),
    ("model.hidden=[64,0]", "config key model.hidden: [64, 0] has a layer of no units"),
    ("env.max_episode_frames=2147483648", "config key env.max_episode_frames: 2147483648 is out"),
])
def test_bad_values_name_the_key(override, message):
    with pytest.raises(DdrlError, match=re.escape(message)):
        load_job(JOBS / "pong-ppo.toml", [override])


def test_ba3c_minibatches_must_fit_its_batch():
    load_job(JOBS / "pong-ppo.toml", ["acting.mode=ba3c", "algo.name=appo"])
    with pytest.raises(DdrlError, match="more minibatches than data points in a batch"):
        load_job(JOBS / "pong-ppo.toml", ["acting.mode=ba3c", "acting.batch_size=2"])


@pytest.mark.parametrize("override, message", [
    ("acting.mode=a2c", "config keys algo.name and acting.mode"),
    ("sync.mode=ps", "config key sync.mode: DQN sums every minibatch gradient"),
    ("dqn.target_period=10001", "config key dqn.target_period: 10001 is not a multiple"),
    ("dqn.replay_frames=50", "config key dqn.replay_frames: 50 frames cannot hold 8 samplers"),
    ("dqn.samplers=0", "config key dqn.samplers: 0 is out of range"),
])
def test_dqn_refuses_what_cannot_work(override, message):
    with pytest.raises(DdrlError, match=re.escape(message)):
        load_job(JOBS / "pong-dqn.toml", [override, "sync.ps=1"])


@pytest.mark.parametrize("mode", ["sync.mode=ps", "sync.mode=central"])
def test_virtual_ranks_need_an_allreduce(mode):
    with pytest.raises(DdrlError, match=re.escape("config key sync.virtual_ranks: 4 virtual ranks "
                                                  "need sync.mode = 'allreduce'")):
        load_job(JOBS / "pong-ppo.toml", ["sync.virtual_ranks=4", mode, "sync.ps=1"])


def test_ps_mode_refuses_a_warm_up():
    with pytest.raises(DdrlError, match="optim.warmup_frames"):
        load_job(JOBS / "pong-ppo.toml", ["optim.warmup_frames=1000", "sync.mode=ps", "sync.ps=1"])


def test_ps_mode_refuses_a_learning_rate_schedule():
    with pytest.raises(DdrlError, match="optim.lr_schedule"):
        load_job(JOBS / "pong-ppo.toml", ["optim.lr_schedule=linear", "sync.mode=ps", "sync.ps=1"])


def test_config_knows_no_simulators_and_runs_the_game_check_it_is_given():
    # A fresh interpreter: this test process may have imported the simulators already.
    code = ("import sys; from ddrl.config import load_config; "
            "load_config(None, ['env.id=ALE/NoSuchGame-v5', 'model.arch=nature']); "
            "print(sorted(m for m in sys.modules if m.startswith(('ddrl.envs', 'ale_py', 'gymnasium'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", (out.stdout, out.stderr)
    seen = []
    with pytest.raises(DdrlError, match="NoSuchGame"):
        def check(env_id):
            seen.append(env_id)
            raise DdrlError(f"config key env.id: unknown environment {env_id!r}")
        # The game is vetted before the other checks, which depend on the kind of game.
        load_config(None, ["env.id=ALE/NoSuchGame-v5", "model.arch=mlp"], check_env=check)
    assert seen == ["ALE/NoSuchGame-v5"]


def test_runs_compare_a_key_an_older_log_lacks_at_its_default():
    from pathlib import Path

    from analysis.load import Run
    from analysis.summary import config_differences

    old = Run(Path("old"), "old", {"algo": {"name": "a2c"}, "run": {"seed": 0}}, {})
    new = Run(Path("new"), "new", {"algo": {"name": "a2c", "rho_clip": 1.0}, "run": {"seed": 1}}, {})
    assert old.flat_config()["algo.rho_clip"] == 1.0
    assert config_differences([old, new]) == ["run.seed"]
    new.config["algo"]["rho_clip"] = 2.0
    assert config_differences([old, new]) == ["algo.rho_clip", "run.seed"]


def test_algo_dqn_alone_chooses_the_dqn_node():
    cfg = load_config(None, ["env.id=CartPole-v1", "model.arch=mlp", "algo.name=dqn"])
    assert cfg.acting.mode == "dqn"
    cfg = load_config(None, ["env.id=CartPole-v1", "model.arch=mlp", "acting.mode=dqn"])
    assert cfg.algo.name == "dqn"


def test_renamed_keys_still_work_with_one_note_each(tmp_path):
    old = tmp_path / "old.toml"
    old.write_text(JOBS.joinpath("pong-ppo.toml").read_text()
                   .replace("ratio_clip = 0.1", "clip = 0.2")
                   .replace("entropy = 0.01\n", "")
                   .replace("[optim]\n", "[optim]\nentropy = 0.03\n"))
    notes = []
    cfg = load_config(old, ["node.gamma=0.9", "algo.samplers=3"], note=notes.append)
    assert (cfg.algo.ratio_clip, cfg.algo.entropy, cfg.algo.gamma, cfg.dqn.samplers) == (0.2, 0.03, 0.9, 3)
    assert notes == [f"ddrl: note: config key {k} is now {v} (the old name still works)"
                     for k, v in [("algo.clip", "algo.ratio_clip"), ("optim.entropy", "algo.entropy"),
                                  ("node.gamma", "algo.gamma"), ("algo.samplers", "dqn.samplers")]]
    assert load_config(JOBS / "pong-ppo.toml", note=notes.append) and len(notes) == 4


def test_an_old_logs_renamed_keys_compare_under_their_new_names():
    from pathlib import Path

    from analysis.load import Run
    from analysis.summary import config_differences

    old = Run(Path("old"), "old", {"node": {"gamma": 0.9}, "optim": {"clip": 0.1}}, {})
    new = Run(Path("new"), "new", {"algo": {"gamma": 0.9}, "optim": {"clip_per_tensor": 0.1}}, {})
    assert old.setting("algo.gamma") == 0.9 and "node.gamma" not in old.flat_config()
    assert config_differences([old, new]) == []


def test_every_key_is_documented_and_every_line_names_a_key():
    from ddrl.config import DOCS
    from ddrl.config_docs import SECTIONS, reference_markdown

    none_by_default = {"eval.target", "eval.max_return", "eval.focus_above",
                       "eval.full_share_above"}
    keys = {f"{sec}.{k}" for sec, body in Config().to_dict().items() for k in body} | none_by_default
    assert set(DOCS) == keys
    assert set(SECTIONS) == set(Config().to_dict())
    page = reference_markdown()
    assert all(f"| `{k}` |" in page for k in keys) and "| `optim.clip` | `optim.clip_per_tensor` |" in page


def test_a_resume_that_changes_what_the_checkpoints_are_of_is_named():
    saved = load_config(JOBS / "cartpole.toml").to_toml()
    cfg = load_config(JOBS / "cartpole.toml", ["model.hidden=[32,32]", "optim.lr=1e-4"])
    assert identity_changes(cfg, saved) == ["model.hidden [64, 64] in the run, [32, 32] now"]
    assert identity_changes(load_config(JOBS / "cartpole.toml", ["optim.lr=1e-4"]), saved) == []
    pong = load_config(JOBS / "pong-ppo.toml")
    assert "env.id 'CartPole-v1' in the run, 'ALE/Pong-v5' now" in identity_changes(pong, saved)


def test_every_line_of_the_shipped_sweep_files_is_a_valid_run():
    from ddrl.commands.slurm import sweep_lines, task_config
    from ddrl.envs import check_env_id

    sweeps = sorted(JOBS.glob("*.sweep"))
    assert sweeps
    for sweep in sweeps:
        # Each file's header names the job its lines apply to, as `ddrl sweep JOB --sweep FILE`.
        main_job = re.search(r"ddrl sweep (\S+\.toml) --sweep", sweep.read_text())
        assert main_job, f"{sweep.name}'s header names no job"
        for task, words in enumerate(sweep_lines(sweep)):
            job, sets = task_config(str(JOBS.parent / main_job[1]), [], str(sweep), task)
            check_env_id(load_job(job, sets).env.id)
            assert sets == [w for w in words if not w.endswith(".toml")]


@pytest.mark.parametrize("overrides, message", [
    (["sync.mode=central", "acting.mode=a2c"], "sync.mode = 'central': the learner runs the ba3c node"),
    (["sync.mode=ps", "sync.ps=1", "sync.backend=horovod"], "sync.mode = 'ps' sends with mpi4py"),
    (["sync.aggregate=2"], "sync.aggregate != 1 (k-of-n) and sync.async = true need"),
    (["sync.mode=ps", "sync.ps=1", "optim.clip_scope=sync"], "config key optim.clip_scope"),
])
def test_a_placements_own_checks_run_wherever_a_job_is_read(overrides, message):
    # The keys alone are valid; the placement that sync.mode names refuses them.
    load_config(JOBS / "pong-ppo.toml", overrides)
    with pytest.raises(DdrlError, match=re.escape(message)):
        load_job(JOBS / "pong-ppo.toml", overrides)


def test_a_job_file_with_the_old_node_section_loads_with_one_note(tmp_path):
    job = tmp_path / "old.toml"
    job.write_text('[node]\nmode = "a2c"\nn_sim = 4\nt_max = 8\n')
    notes = []
    cfg = load_config(job, ["node.batch_size=16"], note=notes.append)
    assert (cfg.acting.mode, cfg.acting.n_sim, cfg.acting.t_max, cfg.acting.batch_size) == ("a2c", 4, 8, 16)
    assert notes == ["ddrl: note: config section [node] is now [acting] (the old name still works)"]
