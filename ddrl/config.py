"""Typed run configuration: defaults from the paper's Table 1, TOML job files, --set overrides.

Config keys are the public interface (job files and `--set key=value` use them), so every
field is declared once (`setting`: default, doc line, choices or bounds), from which the
docs' reference is built (`ddrl/config_docs.py`) and values are validated with a one-line
error naming the key. A key that moved keeps working under its old
name (`RENAMED`, `RENAMED_SECTIONS`), with a one-line note.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from ddrl.errors import DdrlError
from ddrl.output import say


def setting(default: Any = dataclasses.MISSING, *, doc: str, factory: Any = dataclasses.MISSING,
            choices: tuple | None = None, bounds: tuple | None = None) -> Any:
    """A config key's one declaration: its default (or a factory of it), what it does (the
    reference's line), and what it takes: `choices`, or `bounds` (low, high, low inclusive;
    None unbounded on that side). Validation and the reference page read them from here."""
    return field(default=default, default_factory=factory,
                 metadata={"doc": doc, "choices": choices, "bounds": bounds})


@dataclass
class EnvConfig:
    id: str = setting("ALE/Pong-v5",
        doc="gymnasium id: `ALE/<Game>-v5` (ale-py ships the ROMs) or classic control such as `CartPole-v1`")
    sticky: float = setting(0.25, bounds=(0.0, 1.0, True),
        doc="sticky-action probability (Machado et al. 2018)")
    frame_skip: int = setting(4, bounds=(1, None, True),
        doc="emulator frames per agent step (max over the last two)")
    noop_max: int = setting(30, bounds=(0, None, True), doc="up to this many no-ops at reset")
    fire_reset: bool = setting(True, doc="press FIRE at reset in games that need it")
    episodic_life: bool = setting(False,
        doc="training only: a lost life ends the value chain (the game goes on)")
    clip_rewards: bool = setting(True, doc="training only: rewards clipped to [-1, 1]")
    max_episode_frames: int = setting(108_000, bounds=(1, 2**31 - 1, True),
        doc="frame cap per game; a capped game is truncated, not terminated (its value chain ends on the "
            "critic's estimate)")
    # Side of the square gray frames the network sees: 84 as in the papers; 64 costs the
    # Nature CNN less than half the compute per frame.
    size: int = setting(84, bounds=(36, None, True),
        doc="side of the square gray frames; 64 costs the nets less than half the compute of 84")
    # Start-state decorrelation (accelerated-methods paper 5.2): each simulator first takes
    # a random number (up to this many) of random actions.
    decorrelate: int = setting(200, bounds=(0, None, True),
        doc="start-state decorrelation: each simulator first takes a random number (up to this) of random "
            "actions; they stay part of its first game")
    env_threads: int = setting(1, bounds=(0, None, True), doc="C++ threads of each ale-py vector env")
    # Classic control: the indices of the state the observation shows ([]: all of it).
    # CartPole's positions alone ([0, 2]) are a game one observation does not show, for
    # recurrent nets.
    observe: list[int] = setting(factory=list,
        doc="classic control: the indices of the state the observation shows ([]: all); CartPole's positions "
            "alone, [0, 2], need a recurrent net")


@dataclass
class RunConfig:
    seed: int = setting(0, bounds=(0, None, True),
        doc="all seeds (per rank, simulator, evaluation) derive from it")
    # A trillion frames is years of simulation: beyond it, a typo.
    max_frames: int = setting(10_000_000, bounds=(1, 10**12, True),
        doc="stop after this many emulator frames (all ranks together)")
    max_minutes: float = setting(0.0, bounds=(0.0, None, True),
        doc="stop after this many minutes of training (0: no limit)")
    checkpoint_minutes: float = setting(10.0, bounds=(0.0, None, False),
        doc="minutes between periodic checkpoints (written off the training thread)")
    keep_checkpoints: int = setting(3, bounds=(1, None, True), doc="periodic checkpoints kept")
    storage_retry_seconds: float = setting(30.0, bounds=(0.0, None, True),
        doc="a checkpoint whose write fails with an error that may pass (EIO, ESTALE, ENOTCONN, ETIMEDOUT: "
            "an NFS fail-over) is tried once more after this many seconds")
    log_every: int = setting(10, bounds=(1, None, True), doc="updates per `/train` row")
    progress_seconds: float = setting(10.0, bounds=(0.0, None, False), doc="seconds between progress lines")
    # TensorBoard event files beside log.h5 (DIR/tensorboard/), written live by rank 0 with
    # the scalars of /train, /eval and /episodes.
    tensorboard: bool = setting(True,
        doc="TensorBoard event files written live beside the log in `RUN_DIR/tensorboard/`")
    # A Weights & Biases project to mirror the same scalars into, live (the `wandb` extra);
    # "" for none. W&B's own variables apply: WANDB_MODE=offline keeps it on this disk.
    wandb: str = setting("",
        doc="Weights & Biases project that rank 0 mirrors the same scalars into, live, one W&B run per run "
            "directory, a resume continuing it (`pip install ddrl[wandb]`; `WANDB_MODE=offline` keeps it in "
            "`RUN_DIR/wandb/`); empty: none")


@dataclass
class ActingConfig:
    mode: str = setting("ba3c", choices=('ba3c', 'a2c', 'dqn'),
        doc="`ba3c`: asynchronous predictors and a FIFO (the paper); `a2c`: synchronous, reproducible; "
            "`dqn`: samplers, a replay memory and a target network (chosen by `algo.name = \"dqn\"`)")
    n_sim: int = setting(10, bounds=(1, 4096, True), doc="simulators per rank")
    batch_size: int = setting(32, bounds=(1, None, True),
        doc="data points per update per rank (ba3c; DQN's minibatch; in a2c it is `n_sim x t_max`)")
    t_max: int = setting(5, bounds=(1, None, True),
        doc="steps per segment or rollout: the n of n-step returns")
    # a2c: while one group's simulators step (C++ threads, GIL released) the network infers for
    # another. One group makes half the inference calls; on one core per rank it ran as fast
    # as two (Pong recipe, Zen 4), so two stay, for ranks with cores to overlap on.
    groups: int = setting(2, bounds=(1, 64, True),
        doc="alternating simulator groups of the a2c node (at most `n_sim`): the network infers for "
            "one while the others step")
    predictors: int = setting(1, bounds=(1, None, True),
        doc="predictor threads (ba3c; each owns `n_sim / predictors` simulators)")
    predict_batch: int = setting(0, bounds=(0, None, True),
        doc="simulators per inference batch (0: half of a predictor's simulators, or all of them with "
            "several predictors)")
    queue_size: int = setting(0, bounds=(0, None, True),
        doc="FIFO capacity in data points (0: 4 x batch_size)")
    threads: int = setting(0, bounds=(0, None, True),
        doc="TensorFlow threads (0: `SLURM_CPUS_PER_TASK`, `OMP_NUM_THREADS`, or the cores of the affinity "
            "mask shared by the host's ranks)")


@dataclass
class ModelConfig:
    arch: str = setting("ddrl", choices=('ddrl', 'nature', 'a3c', 'mlp'),
        doc="`ddrl` (the paper's 4-conv net), `nature` (Nature CNN), `a3c` (small A3C net), `mlp` (vector "
            "observations)")
    fc: int = setting(256, bounds=(1, None, True),
        doc="FC width of the `ddrl` net (the paper shrank it to 128)")
    hidden: list[int] = setting(factory=lambda: [64, 64], doc="MLP layer widths")
    precision: str = setting("float32", choices=('float32', 'bfloat16', 'auto'),
        doc="`float32`, `bfloat16` (Keras mixed precision; pays only where the CPU has AMX) or `auto` "
            "(bfloat16 for image nets on a CPU with AMX-BF16, else float32)")


@dataclass
class OptimConfig:
    lr: float = setting(1e-3, bounds=(0.0, None, False), doc="learning rate")
    eps: float = setting(1e-8, bounds=(0.0, None, False), doc="Adam epsilon (TF1's \"epsilon hat\")")
    beta1: float = setting(0.8, bounds=(0.0, 1.0, True),
        doc="Adam's first-moment decay (the paper tuned 0.8)")
    beta2: float = setting(0.75, bounds=(0.0, 1.0, True),
        doc="Adam's second-moment decay (the paper tuned 0.75)")
    # The authors' per-tensor clip by average norm; 0 turns it off.
    clip_per_tensor: float = setting(0.1, bounds=(0.0, None, True),
        doc="clipping of each tensor's gradient by its average norm, as in the authors' code (0: off)")
    # Clip by the global norm of the whole gradient (PPO's usual 0.5); 0 turns it off.
    max_grad_norm: float = setting(0.0, bounds=(0.0, None, True),
        doc="clipping by the global norm of the gradient (0: off; PPO's usual 0.5), where "
            "`clip_scope` says")
    # A rank of a few samples has a large, noisy gradient: clipped alone it counts for
    # max_grad_norm whatever its size, so the ranks that saw a reward weigh as much as those
    # that saw noise. Clipping the all-reduced mean is what PyTorch DDP jobs do.
    clip_scope: str = setting("rank", choices=("rank", "sync"),
        doc="where `max_grad_norm` clips: `rank`, each rank's gradient before the all-reduce; "
            "`sync`, the all-reduced mean gradient (all-reduce mode)")
    lr_scaling: str = setting("none", choices=('none', 'sqrt', 'linear'),
        doc="`none`, `sqrt` or `linear` in the number of workers")
    # "linear" decays the learning rate to 0 at run.max_frames.
    lr_schedule: str = setting("constant", choices=('constant', 'linear'),
        doc="`constant`, or `linear`: decays to 0 at `run.max_frames` (all-reduce mode)")
    # Warm-up (Goyal et al. 2017): the rate rises linearly from 0 to its (scaled) value over
    # the first warmup_frames frames of the run, all ranks together; 0: none.
    warmup_frames: int = setting(0, bounds=(0, 10**12, True),
        doc="the learning rate rises linearly from 0 over this many frames (all ranks together) at the run's "
            "start; 0: no warm-up")
    # "rmsprop" is centered RMSProp (decay beta2, momentum 0, eps added under the root), as
    # Nature DQN trained.
    optimizer: str = setting("adam", choices=('adam', 'rmsprop'),
        doc="`adam`, or `rmsprop`: centered RMSProp (decay `beta2`, `eps` under the root), as Nature DQN")


@dataclass
class AlgoConfig:
    name: str = setting("a2c", choices=('a2c', 'ppo', 'vtrace', 'appo', 'dqn'),
        doc="`a2c`: n-step advantage actor-critic (BA3C on the ba3c node); `ppo`; `vtrace`: IMPALA's "
            "actor-critic on V-trace targets; `appo`: PPO's clipped loss on V-trace targets; `dqn`")
    gamma: float = setting(0.99, bounds=(0.0, 1.0, True), doc="discount")
    # Loss weights of the actor-critic algorithms: entropy bonus, value loss.
    entropy: float = setting(0.01, bounds=(0.0, None, True),
        doc="entropy bonus weight (actor-critic algorithms)")
    value_coef: float = setting(0.5, bounds=(0.0, None, True),
        doc="value-loss weight (actor-critic algorithms)")
    # PPO: clip range of the ratio (and of the value change, with clip_value), GAE's lambda,
    # passes over each rollout and minibatches per pass, advantage normalisation and over what
    # (each minibatch, or each rank's rollout once).
    ratio_clip: float = setting(0.1, bounds=(0.0, None, False),
        doc="PPO, APPO: clip range of the probability ratio (and of the value change)")
    gae_lambda: float = setting(0.95, bounds=(0.0, 1.0, True), doc="PPO: GAE's lambda")
    epochs: int = setting(4, bounds=(1, None, True),
        doc="PPO, APPO: passes over each batch; every minibatch is one update")
    minibatches: int = setting(4, bounds=(1, None, True), doc="PPO, APPO: minibatches per pass")
    normalize: bool = setting(True, doc="PPO, APPO: advantages normalised (to mean 0, deviation 1)")
    normalize_over: str = setting("minibatch", choices=('minibatch', 'rollout'),
        doc="PPO, APPO: normalise over each minibatch (CleanRL's) or over each rank's rollout once (steadier "
            "when a rank's share of a minibatch is small)")
    clip_value: bool = setting(True, doc="PPO, APPO: value loss clipped around the acting values")
    # V-trace (vtrace, appo): truncation of the importance weights pi / mu in the targets
    # (rho-bar) and in the trace (c-bar); IMPALA's 1.0 for both.
    rho_clip: float = setting(1.0, bounds=(0.0, None, False),
        doc="V-trace: truncation of the importance weights pi/mu in the targets (rho-bar)")
    c_clip: float = setting(1.0, bounds=(0.0, None, False),
        doc="V-trace: truncation of the importance weights in the trace (c-bar)")
    # Actor-critic algorithms on the a2c or ba3c node: units of an LSTM between the torso and
    # the actor-critic head (0: none); a sequence (a simulator's rollout on the a2c node, a
    # segment of acting.t_max steps on the ba3c node) is unrolled from the state it was acted from.
    recurrent: int = setting(0, bounds=(0, None, True),
        doc="actor-critic algorithms on the a2c or ba3c node (central mode's too): units of an LSTM between "
            "the torso and the actor-critic head (0: none); a sequence is each simulator's rollout (a2c) or "
            "segment of acting.t_max steps (ba3c), unrolled from the state it was acted from")


@dataclass
class DQNConfig:
    """DQN's settings (algo.name = "dqn"): Nature DQN's values (the concurrent-DQN paper's
    Table 5); counts are per rank, in agent steps (frame_skip frames each) unless named frames."""
    replay_frames: int = setting(1_000_000, bounds=(1, None, True),
        doc="replay memory capacity per rank, in frames (each stored once)")
    prepopulate: int = setting(50_000, bounds=(0, None, True),
        doc="agent steps of uniformly random play before learning")
    target_period: int = setting(10_000, bounds=(1, None, True),
        doc="agent steps between target-network updates (C)")
    train_period: int = setting(4, bounds=(1, None, True), doc="agent steps per minibatch (F)")
    n_step: int = setting(1, bounds=(1, None, True),
        doc="steps of the return before the target network's bootstrap")
    double: bool = setting(False, doc="Double DQN's target")
    dueling: bool = setting(False, doc="the dueling head")
    eps_start: float = setting(1.0, bounds=(0.0, 1.0, True),
        doc="epsilon-greedy exploration at the first learning step")
    eps_final: float = setting(0.1, bounds=(0.0, 1.0, True), doc="epsilon after `eps_steps`")
    eps_steps: int = setting(1_000_000, bounds=(1, None, True),
        doc="agent steps of learning over which epsilon is annealed linearly")
    # The concurrent-DQN paper's two techniques: a trainer thread trains on the replay memory
    # while the samplers act with the target network (concurrent); W samplers share one
    # batched inference per step (synchronized) or each infer alone, on threads of their own.
    concurrent: bool = setting(False,
        doc="the samplers act with the target network on a thread of their own while the trainer trains (the "
            "concurrent-DQN paper's Algorithm 1)")
    samplers: int = setting(1, bounds=(1, 1024, True), doc="simulators per rank (W)")
    synchronized: bool = setting(True,
        doc="the W simulators step in lock-step with one batched inference per step; false: each on its own "
            "thread")
    # Each rank's replay memory is saved with the final checkpoint of a stop (time limit,
    # signal, frame budget, target) and taken up again by --resume; otherwise a resumed run
    # prepopulates a new one. Gigabytes per rank at 1M frames.
    save_replay: bool = setting(False,
        doc="each rank saves its replay memory with the final checkpoint of a stop and `--resume` restores "
            "it (gigabytes per rank at 1M frames)")
    # Prioritized replay (Schaul et al. 2016, proportional): transitions drawn with probability
    # proportional to priority^alpha, priority the last |TD error| (the cross-entropy with a
    # categorical head); importance weights (N P)^-beta, beta annealed linearly to 1 over the
    # run's frames. Rainbow's alpha 0.5, beta 0.4.
    prioritized: bool = setting(False,
        doc="prioritized replay: transitions drawn in proportion to priority^alpha (the last |TD error|, or "
            "the cross-entropy of a categorical head), losses weighted by importance weights")
    priority_alpha: float = setting(0.5, bounds=(0.0, None, True),
        doc="prioritized replay: exponent of the priorities (0: uniform)")
    priority_beta: float = setting(0.4, bounds=(0.0, 1.0, True),
        doc="prioritized replay: importance-weight exponent at the start, annealed linearly to 1 over "
            "`run.max_frames`")
    # Categorical DQN (atoms > 1; C51: 51 atoms on [-10, 10]): a distribution over returns
    # per action instead of its mean.
    atoms: int = setting(0, bounds=(0, 1001, True),
        doc="Categorical DQN: atoms of each action's return distribution (0: Q-values; C51: 51)")
    v_min: float = setting(-10.0, doc="Categorical DQN: the lowest atom")
    v_max: float = setting(10.0, doc="Categorical DQN: the highest atom")
    # R2D2's value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + 1e-3 x in the n-step targets:
    # for unclipped rewards (env.clip_rewards = false).
    value_rescale: bool = setting(False,
        doc="R2D2's value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + 0.001x of the n-step targets, for "
            "unclipped rewards")
    # R2D2 (Kapturowski et al. 2019; recurrent > 0: the LSTM's units, R2D2's 512): a recurrent
    # Q network trained on replayed sequences of `sequence` steps, each after `burn_in` steps
    # that only refresh the recurrent state stored with it; a simulator starts a sequence
    # every `sequence_period` steps (R2D2: 80, 40, 40, so sequences overlap by half).
    recurrent: int = setting(0, bounds=(0, None, True),
        doc="R2D2: units of the LSTM between the torso and the Q head (0: no LSTM; R2D2: 512); training on "
            "replayed sequences")
    sequence: int = setting(80, bounds=(1, None, True),
        doc="R2D2: steps of each replayed sequence the loss learns on (R2D2: 80)")
    burn_in: int = setting(40, bounds=(0, None, True),
        doc="R2D2: steps before each sequence that only refresh its stored recurrent state (R2D2: 40)")
    sequence_period: int = setting(40, bounds=(1, None, True),
        doc="R2D2: a simulator starts a sequence every this many steps (R2D2: 40: sequences overlap by half)")
    # A sequence's priority: eta max + (1 - eta) mean of its steps' |TD errors| (R2D2's 0.9).
    priority_eta: float = setting(0.9, bounds=(0.0, 1.0, True),
        doc="R2D2: a sequence's priority, eta max + (1 - eta) mean of its |TD errors|")


@dataclass
class SyncConfig:
    backend: str = setting("mpi", choices=('none', 'mpi', 'horovod'),
        doc="`mpi` (mpi4py Allreduce), `horovod`, or `none` (one rank)")
    mode: str = setting("allreduce", choices=('allreduce', 'ps', 'central'),
        doc="`allreduce`; `ps` (parameter-server ranks); `central` (rank 0 infers and trains, the other "
            "ranks simulate: SEED RL)")
    ps: int = setting(0, bounds=(0, None, True),
        doc="parameter-server ranks (ps mode): the last ranks of the job")
    aggregate: float = setting(1.0, bounds=(0.0, None, False),
        doc="gradients per update: a fraction of the workers or a count (k of n; ps mode)")
    # Python keyword, so the TOML key `async` maps onto this field.
    async_: bool = setting(False, doc="ps mode: apply every gradient as it arrives")
    timeout: float = setting(300.0, bounds=(0.0, None, False),
        doc="seconds a rank waits for the others before it takes them as frozen or lost: all-reduce mode "
            "ends the job (exit 4), ps mode leaves the worker out")
    # The start-up's collectives wait at least this long: ranks that import TensorFlow
    # seconds apart on a busy node (or minutes apart from a slow shared file system) are no
    # fault.
    startup_timeout: float = setting(60.0, bounds=(0.0, None, False),
        doc="seconds the start-up's collectives wait at least (the larger of this and `sync.timeout`): ranks "
            "reach them as their imports end")
    # Rehearsal: each process carries this many ranks of a bigger job (their simulators and
    # seeds, one model), and their gradients are combined as that job's all-reduce would
    # combine them: N processes run a job of N x virtual_ranks ranks, slower, same mathematics.
    virtual_ranks: int = setting(1, bounds=(1, 4096, True),
        doc="rehearsal: ranks of the job each process carries (their simulators and seeds, one model, "
            "gradients combined as the job's all-reduce would): `mpirun -n N` runs a job of N x this many "
            "ranks")
    # The k virtual ranks' gradients in one call on their k minibatches side by side: the
    # fixed cost of a call, which dominates at a handful of samples a rank, paid once.
    virtual_fused: bool = setting(False,
        doc="rehearsal: one gradient call for a process's virtual ranks (the sum of their losses, each "
            "over its own minibatch): the same sum within float rounding, not bit for bit; needs "
            "optim.clip_scope = 'sync' (or no clip) and optim.clip_per_tensor = 0")


@dataclass
class CentralConfig:
    """Central inference (sync.mode = "central", SEED RL): rank 0 infers and trains, the other
    ranks only simulate."""
    # Groups of acting.n_sim simulators per actor rank, each with one step in flight: while
    # one waits for its actions the others step.
    groups: int = setting(2, bounds=(1, 64, True),
        doc="groups of `acting.n_sim` simulators per actor rank, each with one step in flight: while one "
            "waits for its actions the others step")
    # Observations per inference batch on the learner (0: all actors' simulators / groups).
    batch: int = setting(0, bounds=(0, None, True),
        doc="observations per inference batch on the learner (0: all actor simulators / `central.groups`)")
    # A batch closes this long after its first observation arrived, full or not.
    deadline_ms: float = setting(5.0, bounds=(0.0, None, True),
        doc="a batch closes this long after its first observation arrived, full or not, so no actor waits "
            "long")


@dataclass
class EvalConfig:
    every: int = setting(1000, bounds=(1, None, True),
        doc="updates between evaluations (rank 0's evaluator process, frozen weights); with a target, those "
            "skipped while it played are played once it is hit")
    episodes: int = setting(50, bounds=(0, None, True),
        doc="whole games per evaluation, unclipped rewards, no episodic life (0: none)")
    target: float | None = setting(None,
        doc="stop when an evaluation's mean reaches this score (`none`: never)")
    # A crossing of the target counts once the same frozen weights have played this many
    # games in all with a mean at the target (the paper's 50): the first eval.episodes, then
    # the rest at once; eval.episodes or fewer: every evaluation counts as it is.
    confirm_episodes: int = setting(50, bounds=(0, None, True),
        doc="games the weights that cross `eval.target` play in all before the run counts the target reached "
            "(the paper's 50; the rest played at once, their mean over all of them must be at the target)")
    # The most one game can score (Pong: 21): an evaluation stops as soon as that score in
    # every game still to end, less what each game going has lost already, could not bring
    # its mean to the target; none: all are played.
    max_return: float | None = setting(None,
        doc="the most one game's rewards above zero add up to (Pong: 21): an evaluation stops once even "
            "that in every game left, less the points each game going has lost, could not bring its mean "
            "to `eval.target` (`none`: all are played)")
    # While a crossing's confirmation plays, every rank waits (synchronous placements): the
    # evaluator gets the cores, and the run knows in seconds whether it is done.
    pause_to_confirm: bool = setting(True,
        doc="while a crossing of `eval.target` plays its confirmation, every rank waits (all-reduce "
            "placements), so the evaluator has the cores and the run knows at once")
    # Once a live evaluation has scored this much, every later one pauses the ranks as a
    # confirmation does and plays on all the job's cores on this machine: the run learns within
    # seconds of each due evaluation whether its newest weights cross the target (none: never).
    focus_above: float | None = setting(None,
        doc="once a live evaluation scores this much, each later one pauses the ranks and plays on all the "
            "job's cores on the machine, so the run knows within seconds whether its newest weights cross "
            "the target (`none`: never)")
    # The ranks wait for focused evaluations at most this share of the run's wall time (one
    # due beyond it plays in the background); confirmations are not counted.
    pause_share: float = setting(0.05, bounds=(0.0, 1.0, True),
        doc="the ranks wait for focused evaluations at most this share of the run's wall time; one due "
            "beyond it waits until the share allows it, then plays the newest weights (confirmations not "
            "counted). A rehearsal (`sync.virtual_ranks` > 1), whose minutes are not the job's, waits "
            "for every due one")
    # Below this score a focused evaluation is one more sight of weights far from the target,
    # and they wait for at most half the share; what they leave goes to those near it, where
    # an evaluation sooner finds the crossing sooner (none: the whole share from the start).
    full_share_above: float | None = setting(None,
        doc="until a live evaluation scores this much, focused evaluations wait for at most half of "
            "`eval.pause_share`; from then on the whole share, what those before left included (`none`: "
            "the whole share from the start)")
    # A cut evaluation whose games that ended, half of those it set out to play or more,
    # averaged at the target was weights near it, cut by a game or two: the next due one
    # plays at once, past the pause share and not charged to it (a confirmation's bound: one
    # such evaluation per charged one at most). Without it a Pong seed whose 8 ended games
    # scored 19.9 at 15.8 minutes, the share spent, saw no evaluation until 19.9.
    near_miss: bool = setting(True,
        doc="after a cut evaluation whose games that ended (half of its games or more) averaged at "
            "`eval.target`, the next due evaluation is waited for at once, past `eval.pause_share` and not "
            "charged to it (one such per charged evaluation)")
    # A focused evaluation holds the ranks at most this long (a confirmation: this per
    # eval.episodes games), then goes on in the background: one that held a Pong job's ranks
    # 85 s (a few of its games far longer than the rest) left the pause share no room for
    # another evaluation in the rest of the run. 20 s: the Pong recipe's evaluations at the
    # target take 7-12 s on 2 cores (its confirmations 24-32 s), and a wait that long keeps
    # the next one back at most 20 s / eval.pause_share (6.7 minutes at 0.05).
    pause_limit: float = setting(20.0, bounds=(0.0, None, False),
        doc="seconds the ranks wait for one focused evaluation at most (a confirmation: this per "
            "`eval.episodes` games, and never past half of `sync.timeout`); then it goes on in the "
            "background and the ranks train on, charged to `eval.pause_share` for the wait only")
    # After a confirmed crossing (or a budget's end without one), play the weights the
    # evaluator had no time for, to find the earliest at the target: an earlier time to target,
    # known later. Off: the run stops once it knows, and keeps no skipped weights.
    backfill: bool = setting(True,
        doc="after a crossing is confirmed, or a budget ends without one, play the weights the evaluator had "
            "no time for, to find the earliest at the target (earlier, known later); false: the run stops "
            "once it knows")
    # Probability of a random action instead of the greedy one (0: greedy, as in the paper).
    epsilon: float = setting(0.0, bounds=(0.0, 1.0, True),
        doc="probability of a random action in evaluation (0: greedy, as in the paper; DQN's convention is "
            "0.05)")
    # The evaluator process's niceness: at 19 it plays on the CPU time the ranks leave idle.
    nice: int = setting(19, bounds=(0, 19, True),
        doc="the evaluator process's niceness (0-19); at 19 it plays on the CPU time the ranks leave idle "
            "and costs them little (docs/performance.md)")
    # Its CPU time, at most this share of one rank's cores over the run (a due evaluation
    # waits until it fits; 1: no limit): a hard bound for an evaluator at a niceness below 19.
    cpu_share: float = setting(1.0, bounds=(0.0, 1.0, False),
        doc="the evaluator's CPU time, at most this share of one rank's cores: in a synchronous job what it "
            "takes from a rank holds back all (an evaluation due waits until it fits; 1: no limit)")


@dataclass
class DebugConfig:
    slow_ranks: list[int] = setting(factory=list, doc="ranks slowed down on purpose (straggler experiments)")
    slow_factor: float = setting(1.0, bounds=(1.0, None, True), doc="how much slower those ranks compute")
    # Fault injection: this rank stops itself (SIGSTOP) before the sync of this update, as a
    # node hung in its own work (NFS, a driver) would; -1: none.
    freeze_rank: int = setting(-1,
        doc="this rank stops itself (SIGSTOP) before the sync of `freeze_update` (an actor rank: before its "
            "step of that number), as a host hung in its own work would (-1: none)")
    freeze_update: int = setting(10,
        doc="the update at which `freeze_rank` stops itself; -1: at start-up, before the initial weights are "
            "shared; -2: after the last update, before the final barrier; -3: before the placement's "
            "start-up (central mode's split); -4: before MPI's initialisation")
    # A central-mode actor stops between a step's two messages (head, observations).
    freeze_mid_step: bool = setting(False,
        doc="a central-mode `freeze_rank` stops between a step's head and its observations, as a host hung "
            "mid-send would")
    # A frozen rank wakes up after this many seconds (0: it stays frozen).
    freeze_seconds: float = setting(0.0, bounds=(0.0, None, True),
        doc="a central-mode `freeze_rank`, or one frozen at start-up, sleeps this many seconds instead (its "
            "other threads go on; 0: it stops for ever)")


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    run: RunConfig = field(default_factory=RunConfig)
    acting: ActingConfig = field(default_factory=ActingConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    central: CentralConfig = field(default_factory=CentralConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)

    def to_dict(self) -> dict[str, Any]:
        return {sec.name: {_key(f): getattr(getattr(self, sec.name), f.name)
                           for f in dataclasses.fields(getattr(self, sec.name))
                           if getattr(getattr(self, sec.name), f.name) is not None}
                for sec in dataclasses.fields(self)}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())

    @property
    def is_atari(self) -> bool:
        return self.env.id.startswith("ALE/")


def _key(f: dataclasses.Field) -> str:
    return f.name.rstrip("_")


_DQN_KEYS = ("replay_frames", "prepopulate", "target_period", "train_period", "n_step", "double",
             "dueling", "eps_start", "eps_final", "eps_steps", "concurrent", "samplers",
             "synchronized", "save_replay")
# Old name -> new name: job files, --set and the config of old logs keep working.
RENAMED = {
    "node.gamma": "algo.gamma",
    "optim.entropy": "algo.entropy",
    "optim.value_coef": "algo.value_coef",
    "optim.clip": "optim.clip_per_tensor",
    "algo.clip": "algo.ratio_clip",
    **{f"algo.{k}": f"dqn.{k}" for k in _DQN_KEYS},
}


# Old section name -> new: [node] is [acting], as the code's room for a rank's actors.
RENAMED_SECTIONS = {"node": "acting"}


def current_name(key: str) -> tuple[str, str | None]:
    """A key's current name, and the note that says so where it was renamed (None where not)."""
    if key in RENAMED:
        return RENAMED[key], f"ddrl: note: config key {key} is now {RENAMED[key]} (the old name still works)"
    section, dot, name = key.partition(".")
    if dot and section in RENAMED_SECTIONS:
        new = RENAMED_SECTIONS[section]
        return f"{new}.{name}", (f"ddrl: note: config section [{section}] is now [{new}] (the old "
                                 "name still works)")
    return key, None


def current_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """`section.key -> value` with renamed keys under their current names (an old log's
    config, for comparing it with new runs)."""
    return {current_name(k)[0]: v for k, v in flat.items()}


def _declared(what: str) -> dict[str, Any]:
    """`section.key -> ` the choices or bounds its field declares (`setting`)."""
    return {f"{sec}.{_key(f)}": f.metadata[what]
            for sec, kind in typing.get_type_hints(Config).items()
            for f in dataclasses.fields(kind)
            if f.metadata.get(what) is not None}


_CHOICES = _declared("choices")
# (low, high, low inclusive); None means unbounded on that side.
_RANGES = _declared("bounds")
# One line per key, what it does: the configuration reference's (ddrl/config_docs.py).
DOCS = _declared("doc")


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check (and where lossless, convert) one value against its field's type."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) and type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        return _coerce(key, value, next(a for a in args if a is not type(None)))
    if origin is list:
        if not isinstance(value, list):
            raise DdrlError(f"config key {key}: expected a list, got {value!r}")
        return [_coerce(key, v, args[0]) for v in value]
    if typ is bool:
        if isinstance(value, bool):
            return value
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float):
            # 1e99 is a float that happens to be whole: a count must be written as one.
            raise DdrlError(f"config key {key}: expected an integer, got the float {value!r} "
                            "(write counts without a point or exponent, e.g. 10_000_000)")
    elif typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ is str:
        if isinstance(value, str):
            return value
    tname = getattr(typ, "__name__", str(typ))
    raise DdrlError(f"config key {key}: expected {tname}, got {value!r}")


def _parse_cli_value(text: str) -> Any:
    """`--set k=v` values are TOML literals (1e-3, true, [1, 2]); anything else is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply(cfg: Config, key: str, value: Any, note: Callable[[str], None]) -> str:
    """Sets one key; returns its current name. An unknown key is named as it was written."""
    given = key
    key, renamed = current_name(key)
    parts = key.split(".")
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    if len(parts) != 2 or parts[0] not in sections:
        raise DdrlError(f"unknown config key {given!r} (sections: {', '.join(sections)})")
    section = getattr(cfg, parts[0])
    fields = {_key(f): f for f in dataclasses.fields(section)}
    if parts[1] not in fields:
        raise DdrlError(f"unknown config key {given!r} (known in [{parts[0]}]: {', '.join(fields)})")
    if renamed:
        note(renamed)
    f = fields[parts[1]]
    hints = typing.get_type_hints(type(section))
    setattr(section, f.name, _coerce(key, value, hints[f.name]))
    return key


def _acting_for_algo(cfg: Config, given: set[str]) -> None:
    """DQN has one node and the node one algorithm: naming either side is enough."""
    if cfg.algo.name == "dqn" and "acting.mode" not in given:
        cfg.acting.mode = "dqn"
    elif cfg.acting.mode == "dqn" and "algo.name" not in given:
        cfg.algo.name = "dqn"


def _flatten(data: dict[str, Any], where: str) -> dict[str, Any]:
    flat = {}
    for sec, body in data.items():
        if not isinstance(body, dict):
            raise DdrlError(f"{where}: top-level key {sec!r} must be a [section]")
        for k, v in body.items():
            flat[f"{sec}.{k}"] = v
    return flat


def flat_values(cfg: Config) -> dict[str, Any]:
    return {f"{sec}.{k}": v for sec, body in cfg.to_dict().items() for k, v in body.items()}


# What a run's checkpoints are the weights and optimizer state of: a resume that changes one
# of these cannot load them, or would go on with one game's policy in another game.
IDENTITY_KEYS = ("env.id", "env.size", "env.observe", "model.arch", "model.fc", "model.hidden",
                 "algo.name", "algo.recurrent", "dqn.dueling", "dqn.atoms", "dqn.recurrent",
                 "optim.optimizer")


def identity_changes(cfg: Config, saved_toml: str) -> list[str]:
    """`key: saved -> now` for each identity key `cfg` changes from a run's saved
    config.toml (keys it lacks count at their defaults; old names are read as new)."""
    saved = {**flat_values(Config()), **current_keys(_flatten(tomllib.loads(saved_toml), "config.toml"))}
    now = flat_values(cfg)
    return [f"{k} {saved.get(k)!r} in the run, {now[k]!r} now" for k in IDENTITY_KEYS
            if saved.get(k) != now[k]]


def validate(cfg: Config) -> None:
    """Choices, ranges and the combinations of keys that cannot work together (a placement's
    own combinations are its module's: `load_config`'s `checks`)."""
    values = flat_values(cfg)
    for key, choices in _CHOICES.items():
        if values[key] not in choices:
            raise DdrlError(f"config key {key}: {values[key]!r} is not one of {', '.join(choices)}")
    for key, (low, high, low_incl) in _RANGES.items():
        v = values[key]
        if isinstance(v, float) and not math.isfinite(v):
            raise DdrlError(f"config key {key}: {v} is not a finite number")
        if low is not None and (v < low or (v == low and not low_incl)):
            bound = ">=" if low_incl else ">"
            raise DdrlError(f"config key {key}: {v} is out of range (must be {bound} {low})")
        if high is not None and v > high:
            raise DdrlError(f"config key {key}: {v} is out of range (must be <= {high})")
    for key in ("optim.beta1", "optim.beta2"):
        # Adam divides by 1 - beta**t: at 1.0 the step is NaN (beta1) or zero (beta2).
        if values[key] >= 1.0:
            raise DdrlError(f"config key {key}: {values[key]} is out of range (must be < 1)")
    if cfg.env.observe and cfg.is_atari:
        raise DdrlError("config key env.observe: picks parts of a classic-control state; an "
                        "Atari game's observation is its frames")
    if len(set(cfg.env.observe)) != len(cfg.env.observe) or any(i < 0 for i in cfg.env.observe):
        raise DdrlError(f"config key env.observe: {cfg.env.observe} must be distinct indices >= 0")
    if any(width < 1 for width in cfg.model.hidden):
        raise DdrlError(f"config key model.hidden: {cfg.model.hidden} has a layer of no units")
    if None not in (cfg.eval.target, cfg.eval.max_return) and cfg.eval.max_return < cfg.eval.target:
        raise DdrlError(f"config key eval.max_return: {cfg.eval.max_return:g} is below eval.target "
                        f"{cfg.eval.target:g}, which could then never be reached")
    if cfg.eval.target is not None and cfg.eval.episodes == 0:
        raise DdrlError(f"config key eval.target: {cfg.eval.target:g} can never be reached with "
                        "eval.episodes = 0 (no evaluations): also set eval.target = none")
    _validate_dqn(cfg)
    if cfg.model.arch == "ddrl" and cfg.env.size < 52:
        raise DdrlError("config key env.size: the 'ddrl' net needs frames of at least 52x52")
    if cfg.model.arch == "mlp" and cfg.is_atari:
        raise DdrlError("config key model.arch: 'mlp' is for vector observations, not Atari")
    if cfg.model.arch != "mlp" and not cfg.is_atari:
        raise DdrlError(f"config key model.arch: {cfg.model.arch!r} needs image observations; use 'mlp'")


def _validate_dqn(cfg: Config) -> None:
    dqn_algo, dqn_node = cfg.algo.name == "dqn", cfg.acting.mode == "dqn"
    if dqn_algo != dqn_node:
        raise DdrlError("config keys algo.name and acting.mode: DQN learns from a replay memory, "
                        "so algo.name = 'dqn' and acting.mode = 'dqn' go together")
    if not dqn_algo:
        return
    a = cfg.dqn
    if a.atoms == 1:
        raise DdrlError("config key dqn.atoms: one atom is no distribution; use 0 (Q-values) or "
                        "2 or more (Categorical DQN, 51 in C51)")
    if a.atoms > 1 and not a.v_min < a.v_max:
        raise DdrlError(f"config keys dqn.v_min and dqn.v_max: the atoms' support [{a.v_min:g}, "
                        f"{a.v_max:g}] is empty; v_min must be below v_max")
    if a.atoms > 1 and a.value_rescale:
        raise DdrlError("config key dqn.value_rescale: rescaling is for Q-values (R2D2), not "
                        "a categorical head's fixed support; set dqn.atoms = 0 or widen "
                        "dqn.v_min / dqn.v_max instead")
    if a.recurrent and a.atoms > 1:
        raise DdrlError("config key dqn.atoms: a distributional head is not available with a "
                        "recurrent Q network (dqn.recurrent > 0) yet")


def load_config(path: str | Path | None, overrides: list[str] = (),
                check_env: Callable[[str], None] | None = None,
                note: Callable[[str], None] | None = None,
                checks: Sequence[Callable[[Config], None]] = ()) -> Config:
    """Defaults, then the job file, then `key=value` overrides; validated as a whole.
    `check_env` (`ddrl.envs.check_env_id` for anything that runs the game) vets the game id
    first, since other checks depend on the kind of game; config itself knows no simulators.
    `checks` come from the floors above after validation (the placement's: see
    `ddrl.placement.load_job`). `note` takes the one-line notes on renamed keys (default:
    standard error)."""
    say_note = note or (lambda line: say(line, err=True))
    said: set[str] = set()

    def note(line: str) -> None:  # a renamed section's note once, not once per key
        if line not in said:
            said.add(line)
            say_note(line)
    cfg = Config()
    given: set[str] = set()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise DdrlError(f"job file not found: {path} (`ddrl recipes` lists the job files "
                            "that come with ddrl, by name)")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise DdrlError(f"{path}: not valid TOML ({exc})") from None
        for key, value in _flatten(data, str(path)).items():
            given.add(_apply(cfg, key, value, note))
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise DdrlError(f"--set {item!r}: expected key=value")
        given.add(_apply(cfg, key.strip(), _parse_cli_value(text.strip()), note))
    _acting_for_algo(cfg, given)
    if check_env is not None:
        check_env(cfg.env.id)
    validate(cfg)
    for check in checks:
        check(cfg)
    return cfg
