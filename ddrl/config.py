"""Typed run configuration: defaults from the paper's Table 1, TOML job files, --set overrides.

Config keys are the public interface (job files and `--set key=value` use them), so every
field here is documented (`ddrl/config_docs.py`, from which the docs' reference is built) and
validated with a one-line error naming the key. A key that moved keeps working under its old
name (`RENAMED`), with a one-line note.
"""
from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import tomli_w

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library
    import tomli as tomllib

from ddrl.errors import DdrlError
from ddrl.output import say


@dataclass
class EnvConfig:
    id: str = "ALE/Pong-v5"
    sticky: float = 0.25
    frame_skip: int = 4
    noop_max: int = 30
    fire_reset: bool = True
    episodic_life: bool = False
    clip_rewards: bool = True
    max_episode_frames: int = 108_000
    # Side of the square gray frames the network sees: 84 as in the papers; 64 costs the
    # Nature CNN less than half the compute per frame.
    size: int = 84
    # Start-state decorrelation (accelerated-methods paper 5.2): each simulator first takes
    # a random number (up to this many) of random actions.
    decorrelate: int = 200
    env_threads: int = 1
    # Classic control: the indices of the state the observation shows ([]: all of it).
    # CartPole's positions alone ([0, 2]) are a game one observation does not show, for
    # recurrent nets.
    observe: list[int] = field(default_factory=list)


@dataclass
class RunConfig:
    seed: int = 0
    max_frames: int = 10_000_000
    max_minutes: float = 0.0
    checkpoint_minutes: float = 10.0
    keep_checkpoints: int = 3
    storage_retry_seconds: float = 30.0
    log_every: int = 10
    progress_seconds: float = 10.0
    # TensorBoard event files beside log.h5 (DIR/tensorboard/), written live by rank 0 with
    # the scalars of /train, /eval and /episodes.
    tensorboard: bool = True
    # A Weights & Biases project to mirror the same scalars into, live (the `wandb` extra);
    # "" for none. W&B's own variables apply: WANDB_MODE=offline keeps it on this disk.
    wandb: str = ""


@dataclass
class NodeConfig:
    mode: str = "ba3c"
    n_sim: int = 10
    batch_size: int = 32
    t_max: int = 5
    predictors: int = 1
    predict_batch: int = 0
    queue_size: int = 0
    threads: int = 0


@dataclass
class ModelConfig:
    arch: str = "ddrl"
    fc: int = 256
    hidden: list[int] = field(default_factory=lambda: [64, 64])
    precision: str = "float32"


@dataclass
class OptimConfig:
    lr: float = 1e-3
    eps: float = 1e-8
    beta1: float = 0.8
    beta2: float = 0.75
    # The authors' per-tensor clip by average norm; 0 turns it off.
    clip_per_tensor: float = 0.1
    # Clip by the global norm of the whole gradient (PPO's usual 0.5); 0 turns it off.
    max_grad_norm: float = 0.0
    lr_scaling: str = "none"
    # "linear" decays the learning rate to 0 at run.max_frames.
    lr_schedule: str = "constant"
    # Warm-up (Goyal et al. 2017): the rate rises linearly from 0 to its (scaled) value over
    # the first warmup_frames frames of the run, all ranks together; 0: none.
    warmup_frames: int = 0
    # "rmsprop" is centered RMSProp (decay beta2, momentum 0, eps added under the root), as
    # Nature DQN trained.
    optimizer: str = "adam"


@dataclass
class AlgoConfig:
    name: str = "a2c"
    gamma: float = 0.99
    # Loss weights of the actor-critic algorithms: entropy bonus, value loss.
    entropy: float = 0.01
    value_coef: float = 0.5
    # PPO: clip range of the ratio (and of the value change, with clip_value), GAE's lambda,
    # passes over each rollout and minibatches per pass, advantage normalisation and over what
    # (each minibatch, or each rank's rollout once).
    ratio_clip: float = 0.1
    gae_lambda: float = 0.95
    epochs: int = 4
    minibatches: int = 4
    normalize: bool = True
    normalize_over: str = "minibatch"
    clip_value: bool = True
    # V-trace (vtrace, appo): truncation of the importance weights pi / mu in the targets
    # (rho-bar) and in the trace (c-bar); IMPALA's 1.0 for both.
    rho_clip: float = 1.0
    c_clip: float = 1.0
    # Actor-critic algorithms on the a2c or ba3c node: units of an LSTM between the torso and
    # the actor-critic head (0: none); a sequence (a simulator's rollout on the a2c node, a
    # segment of node.t_max steps on the ba3c node) is unrolled from the state it was acted from.
    recurrent: int = 0


@dataclass
class DQNConfig:
    """DQN's settings (algo.name = "dqn"): Nature DQN's values (the concurrent-DQN paper's
    Table 5); counts are per rank, in agent steps (frame_skip frames each) unless named frames."""
    replay_frames: int = 1_000_000
    prepopulate: int = 50_000
    target_period: int = 10_000
    train_period: int = 4
    n_step: int = 1
    double: bool = False
    dueling: bool = False
    eps_start: float = 1.0
    eps_final: float = 0.1
    eps_steps: int = 1_000_000
    # The concurrent-DQN paper's two techniques: a trainer thread trains on the replay memory
    # while the samplers act with the target network (concurrent); W samplers share one
    # batched inference per step (synchronized) or each infer alone, on threads of their own.
    concurrent: bool = False
    samplers: int = 1
    synchronized: bool = True
    # Each rank's replay memory is saved with the final checkpoint of a stop (time limit,
    # signal, frame budget, target) and taken up again by --resume; otherwise a resumed run
    # prepopulates a new one. Gigabytes per rank at 1M frames.
    save_replay: bool = False
    # Prioritized replay (Schaul et al. 2016, proportional): transitions drawn with probability
    # proportional to priority^alpha, priority the last |TD error| (the cross-entropy with a
    # categorical head); importance weights (N P)^-beta, beta annealed linearly to 1 over the
    # run's frames. Rainbow's alpha 0.5, beta 0.4.
    prioritized: bool = False
    priority_alpha: float = 0.5
    priority_beta: float = 0.4
    # Categorical DQN (atoms > 1; C51: 51 atoms on [-10, 10]): a distribution over returns
    # per action instead of its mean.
    atoms: int = 0
    v_min: float = -10.0
    v_max: float = 10.0
    # R2D2's value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + 1e-3 x in the n-step targets:
    # for unclipped rewards (env.clip_rewards = false).
    value_rescale: bool = False
    # R2D2 (Kapturowski et al. 2019; recurrent > 0: the LSTM's units, R2D2's 512): a recurrent
    # Q network trained on replayed sequences of `sequence` steps, each after `burn_in` steps
    # that only refresh the recurrent state stored with it; a simulator starts a sequence
    # every `sequence_period` steps (R2D2: 80, 40, 40, so sequences overlap by half).
    recurrent: int = 0
    sequence: int = 80
    burn_in: int = 40
    sequence_period: int = 40
    # A sequence's priority: eta max + (1 - eta) mean of its steps' |TD errors| (R2D2's 0.9).
    priority_eta: float = 0.9


@dataclass
class SyncConfig:
    backend: str = "mpi"
    mode: str = "allreduce"
    ps: int = 0
    aggregate: float = 1.0
    # Python keyword, so the TOML key `async` maps onto this field.
    async_: bool = False
    timeout: float = 300.0
    # The start-up's collectives wait at least this long: ranks that import TensorFlow
    # seconds apart on a busy node (or minutes apart from a slow shared file system) are no
    # fault.
    startup_timeout: float = 60.0
    # Rehearsal: each process carries this many ranks of a bigger job (their simulators and
    # seeds, one model), and their gradients are combined as that job's all-reduce would
    # combine them: N processes run a job of N x virtual_ranks ranks, slower, same mathematics.
    virtual_ranks: int = 1


@dataclass
class CentralConfig:
    """Central inference (sync.mode = "central", SEED RL): rank 0 infers and trains, the other
    ranks only simulate."""
    # Groups of node.n_sim simulators per actor rank, each with one step in flight: while
    # one waits for its actions the others step.
    groups: int = 2
    # Observations per inference batch on the learner (0: all actors' simulators / groups).
    batch: int = 0
    # A batch closes this long after its first observation arrived, full or not.
    deadline_ms: float = 5.0


@dataclass
class EvalConfig:
    every: int = 1000
    episodes: int = 50
    target: float | None = None
    # A crossing of the target counts once the same frozen weights have played this many
    # games in all with a mean at the target (the paper's 50): the first eval.episodes, then
    # the rest at once; eval.episodes or fewer: every evaluation counts as it is.
    confirm_episodes: int = 50
    # The most one game can score (Pong: 21): an evaluation stops as soon as that score in
    # every game still to end could not bring its mean to the target; none: all are played.
    max_return: float | None = None
    # While a crossing's confirmation plays, every rank waits (synchronous placements): the
    # evaluator gets the cores, and the run knows in seconds whether it is done.
    pause_to_confirm: bool = True
    # Once a live evaluation has scored this much, every later one pauses the ranks as a
    # confirmation does and plays on all the job's cores on this machine: the run learns within
    # seconds of each due evaluation whether its newest weights cross the target (none: never).
    focus_above: float | None = None
    # The ranks wait for focused evaluations at most this share of the run's wall time (one
    # due beyond it plays in the background); confirmations are not counted.
    pause_share: float = 0.05
    # After a confirmed crossing (or a budget's end without one), play the weights the
    # evaluator had no time for, to find the earliest at the target: an earlier time to target,
    # known later. Off: the run stops once it knows, and keeps no skipped weights.
    backfill: bool = True
    # Probability of a random action instead of the greedy one (0: greedy, as in the paper).
    epsilon: float = 0.0
    # The evaluator process's niceness: at 19 it plays on the CPU time the ranks leave idle.
    nice: int = 19
    # Its CPU time, at most this share of one rank's cores over the run (a due evaluation
    # waits until it fits; 1: no limit): a hard bound for an evaluator at a niceness below 19.
    cpu_share: float = 1.0


@dataclass
class DebugConfig:
    slow_ranks: list[int] = field(default_factory=list)
    slow_factor: float = 1.0
    # Fault injection: this rank stops itself (SIGSTOP) before the sync of this update, as a
    # node hung in its own work (NFS, a driver) would; -1: none.
    freeze_rank: int = -1
    freeze_update: int = 10
    # A central-mode actor stops between a step's two messages (head, observations).
    freeze_mid_step: bool = False
    # A frozen rank wakes up after this many seconds (0: it stays frozen).
    freeze_seconds: float = 0.0


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    run: RunConfig = field(default_factory=RunConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
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


def current_keys(flat: dict[str, Any]) -> dict[str, Any]:
    """`section.key -> value` with renamed keys under their current names (an old log's
    config, for comparing it with new runs)."""
    return {RENAMED.get(k, k): v for k, v in flat.items()}


_CHOICES = {
    "node.mode": ("ba3c", "a2c", "dqn"),
    "model.arch": ("ddrl", "nature", "a3c", "mlp"),
    "model.precision": ("float32", "bfloat16", "auto"),
    "optim.lr_scaling": ("none", "sqrt", "linear"),
    "optim.lr_schedule": ("constant", "linear"),
    "algo.name": ("a2c", "ppo", "vtrace", "appo", "dqn"),
    "algo.normalize_over": ("minibatch", "rollout"),
    "optim.optimizer": ("adam", "rmsprop"),
    "sync.backend": ("none", "mpi", "horovod"),
    "sync.mode": ("allreduce", "ps", "central"),
}
# (low, high, low inclusive); None means unbounded on that side.
_RANGES = {
    "env.sticky": (0.0, 1.0, True), "env.frame_skip": (1, None, True),
    "env.noop_max": (0, None, True), "env.max_episode_frames": (1, 2**31 - 1, True),
    "env.size": (36, None, True),
    "env.decorrelate": (0, None, True), "env.env_threads": (0, None, True),
    # A trillion frames is years of simulation: beyond it, a typo.
    "run.max_frames": (1, 10**12, True), "run.max_minutes": (0.0, None, True),
    "run.seed": (0, None, True),
    "run.checkpoint_minutes": (0.0, None, False), "run.keep_checkpoints": (1, None, True),
    "run.storage_retry_seconds": (0.0, None, True),
    "run.log_every": (1, None, True), "run.progress_seconds": (0.0, None, False),
    "node.n_sim": (1, 4096, True), "node.batch_size": (1, None, True),
    "node.t_max": (1, None, True), "algo.gamma": (0.0, 1.0, True),
    "node.predictors": (1, None, True), "node.predict_batch": (0, None, True),
    "node.queue_size": (0, None, True), "node.threads": (0, None, True),
    "model.fc": (1, None, True), "optim.lr": (0.0, None, False),
    "optim.eps": (0.0, None, False), "optim.beta1": (0.0, 1.0, True),
    "optim.beta2": (0.0, 1.0, True), "optim.clip_per_tensor": (0.0, None, True),
    "algo.entropy": (0.0, None, True), "optim.max_grad_norm": (0.0, None, True),
    "algo.ratio_clip": (0.0, None, False), "algo.gae_lambda": (0.0, 1.0, True),
    "algo.epochs": (1, None, True), "algo.minibatches": (1, None, True),
    "algo.rho_clip": (0.0, None, False), "algo.c_clip": (0.0, None, False),
    "algo.recurrent": (0, None, True),
    "dqn.replay_frames": (1, None, True), "dqn.prepopulate": (0, None, True),
    "dqn.target_period": (1, None, True), "dqn.train_period": (1, None, True),
    "dqn.n_step": (1, None, True), "dqn.eps_start": (0.0, 1.0, True),
    "dqn.eps_final": (0.0, 1.0, True), "dqn.eps_steps": (1, None, True),
    "dqn.samplers": (1, 1024, True), "dqn.priority_alpha": (0.0, None, True),
    "dqn.priority_beta": (0.0, 1.0, True), "dqn.atoms": (0, 1001, True),
    "dqn.recurrent": (0, None, True), "dqn.sequence": (1, None, True),
    "dqn.burn_in": (0, None, True), "dqn.sequence_period": (1, None, True),
    "dqn.priority_eta": (0.0, 1.0, True),
    "algo.value_coef": (0.0, None, True),
    "sync.ps": (0, None, True), "sync.aggregate": (0.0, None, False),
    "sync.timeout": (0.0, None, False), "sync.startup_timeout": (0.0, None, False),
    "debug.freeze_seconds": (0.0, None, True),
    "sync.virtual_ranks": (1, 4096, True), "optim.warmup_frames": (0, 10**12, True),
    "eval.every": (1, None, True), "eval.confirm_episodes": (0, None, True),
    "eval.episodes": (0, None, True), "eval.epsilon": (0.0, 1.0, True),
    "eval.cpu_share": (0.0, 1.0, False),
    "eval.pause_share": (0.0, 1.0, True), "eval.nice": (0, 19, True),
    "debug.slow_factor": (1.0, None, True),
    "central.groups": (1, 64, True), "central.batch": (0, None, True),
    "central.deadline_ms": (0.0, None, True),
}


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
    """Sets one key; returns its current name."""
    if key in RENAMED:
        note(f"ddrl: note: config key {key} is now {RENAMED[key]} (the old name still works)")
        key = RENAMED[key]
    parts = key.split(".")
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    if len(parts) != 2 or parts[0] not in sections:
        raise DdrlError(f"unknown config key {key!r} (sections: {', '.join(sections)})")
    section = getattr(cfg, parts[0])
    fields = {_key(f): f for f in dataclasses.fields(section)}
    if parts[1] not in fields:
        raise DdrlError(f"unknown config key {key!r} (known in [{parts[0]}]: {', '.join(fields)})")
    f = fields[parts[1]]
    hints = typing.get_type_hints(type(section))
    setattr(section, f.name, _coerce(key, value, hints[f.name]))
    return key


def _node_for_algo(cfg: Config, given: set[str]) -> None:
    """DQN has one node and the node one algorithm: naming either side is enough."""
    if cfg.algo.name == "dqn" and "node.mode" not in given:
        cfg.node.mode = "dqn"
    elif cfg.node.mode == "dqn" and "algo.name" not in given:
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
    """Choices, ranges and the combinations of keys that cannot work together."""
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
    rollout = cfg.node.n_sim * cfg.node.t_max * cfg.env.frame_skip
    if cfg.node.mode == "a2c" and rollout > cfg.run.max_frames:
        raise DdrlError(f"config key run.max_frames: {cfg.run.max_frames:,} is less than one rollout "
                        f"of one rank (node.n_sim x node.t_max x env.frame_skip = {rollout:,} frames)")
    if None not in (cfg.eval.target, cfg.eval.max_return) and cfg.eval.max_return < cfg.eval.target:
        raise DdrlError(f"config key eval.max_return: {cfg.eval.max_return:g} is below eval.target "
                        f"{cfg.eval.target:g}, which could then never be reached")
    if cfg.eval.target is not None and cfg.eval.episodes == 0:
        raise DdrlError(f"config key eval.target: {cfg.eval.target:g} can never be reached with "
                        "eval.episodes = 0 (no evaluations): also set eval.target = none")
    if cfg.node.mode == "ba3c" and cfg.node.n_sim < cfg.node.predictors:
        raise DdrlError("config key node.predictors: more predictor threads than simulators (node.n_sim)")
    if cfg.algo.recurrent and "dqn" in (cfg.node.mode, cfg.algo.name):
        raise DdrlError("config key algo.recurrent: a recurrent actor-critic runs on the a2c or "
                        "ba3c node (central mode's too) with an actor-critic algo.name; R2D2 is "
                        "dqn.recurrent")
    if cfg.algo.recurrent and cfg.node.mode == "ba3c" and cfg.node.batch_size % cfg.node.t_max:
        raise DdrlError(f"config key node.batch_size: {cfg.node.batch_size} is not a whole number "
                        f"of node.t_max = {cfg.node.t_max} steps (a recurrent network learns on "
                        "sequences of node.t_max)")
    # A recurrent network's data points are sequences: a rollout per simulator (a2c), a
    # segment of node.t_max steps (ba3c).
    sequences = cfg.node.n_sim if cfg.node.mode == "a2c" else cfg.node.batch_size // cfg.node.t_max
    if cfg.algo.recurrent and cfg.algo.minibatches > sequences:
        raise DdrlError(f"config key algo.minibatches: {cfg.algo.minibatches} minibatches of "
                        f"{sequences} sequences (a recurrent network's data points: "
                        "each simulator's rollout on the a2c node, node.batch_size / node.t_max "
                        "on the ba3c node)")
    if cfg.node.mode == "a2c" and cfg.algo.minibatches > cfg.node.n_sim * cfg.node.t_max:
        raise DdrlError("config key algo.minibatches: more minibatches than data points in a "
                        "rollout (node.n_sim x node.t_max)")
    if cfg.node.mode == "ba3c" and cfg.algo.minibatches > cfg.node.batch_size:
        raise DdrlError("config key algo.minibatches: more minibatches than data points in a "
                        "batch (node.batch_size)")
    if cfg.optim.lr_schedule != "constant" and cfg.sync.mode == "ps":
        raise DdrlError("config key optim.lr_schedule: parameter servers keep a constant "
                        "learning rate; use sync.mode = 'allreduce'")
    if cfg.optim.warmup_frames and cfg.sync.mode == "ps":
        raise DdrlError("config key optim.warmup_frames: parameter servers keep a constant "
                        "learning rate; use sync.mode = 'allreduce'")
    if cfg.sync.virtual_ranks > 1 and cfg.sync.mode != "allreduce":
        # k-of-n and central inference depend on when each rank's message arrives, which a
        # process that computes its ranks one after another cannot rehearse.
        raise DdrlError(f"config key sync.virtual_ranks: {cfg.sync.virtual_ranks} virtual ranks "
                        f"need sync.mode = 'allreduce' (not {cfg.sync.mode!r})")
    if cfg.sync.mode == "ps" and cfg.sync.ps < 1:
        raise DdrlError("config key sync.ps: sync.mode = 'ps' needs at least 1 parameter server")
    _validate_dqn(cfg)
    if cfg.model.arch == "ddrl" and cfg.env.size < 52:
        raise DdrlError("config key env.size: the 'ddrl' net needs frames of at least 52x52")
    if cfg.model.arch == "mlp" and cfg.is_atari:
        raise DdrlError("config key model.arch: 'mlp' is for vector observations, not Atari")
    if cfg.model.arch != "mlp" and not cfg.is_atari:
        raise DdrlError(f"config key model.arch: {cfg.model.arch!r} needs image observations; use 'mlp'")


def replay_frames_needed(cfg: Config, streams: int) -> int:
    """The smallest replay memory whose `streams` each hold two frame stacks and n-step
    transitions, or two of R2D2's sequences (burn-in, the steps learned, their n-step
    successors) wherever they start."""
    a = cfg.dqn
    stack = 4 if cfg.is_atari else 1
    steps = (a.burn_in + a.sequence + a.sequence_period) if a.recurrent else 1
    return streams * (stack + steps + a.n_step) * 2


def _validate_dqn(cfg: Config) -> None:
    dqn_algo, dqn_node = cfg.algo.name == "dqn", cfg.node.mode == "dqn"
    if dqn_algo != dqn_node:
        raise DdrlError("config keys algo.name and node.mode: DQN learns from a replay memory, "
                        "so algo.name = 'dqn' and node.mode = 'dqn' go together")
    if not dqn_algo:
        return
    a = cfg.dqn
    if cfg.sync.mode == "ps":
        raise DdrlError("config key sync.mode: DQN sums every minibatch gradient across ranks; "
                        "use sync.mode = 'allreduce'")
    if a.concurrent and a.target_period % a.train_period:
        raise DdrlError(f"config key dqn.target_period: {a.target_period} is not a multiple of "
                        f"dqn.train_period ({a.train_period}), so concurrent training cannot "
                        "train target_period / train_period minibatches per period")
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
    if a.replay_frames < replay_frames_needed(cfg, a.samplers):
        raise DdrlError(f"config key dqn.replay_frames: {a.replay_frames} frames cannot hold "
                        f"{a.samplers} samplers' stacks and {a.n_step}-step transitions")


def load_config(path: str | Path | None, overrides: list[str] = (),
                check_env: Callable[[str], None] | None = None,
                note: Callable[[str], None] | None = None) -> Config:
    """Defaults, then the job file, then `key=value` overrides; validated as a whole.
    `check_env` (`ddrl.envs.check_env_id` for anything that runs the game) vets the game id
    first, since other checks depend on the kind of game; config itself knows no simulators.
    `note` takes the one-line notes on renamed keys (default: standard error)."""
    note = note or (lambda line: say(line, err=True))
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
    _node_for_algo(cfg, given)
    if check_env is not None:
        check_env(cfg.env.id)
    validate(cfg)
    return cfg
