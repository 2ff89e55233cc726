"""One line per config key: what it does. The documentation's configuration reference is built
from these, the dataclasses' defaults and types, and config.py's choices, ranges and renamed
keys; a unit test fails when a key has no line here or a line names no key."""
from __future__ import annotations

SECTIONS = {
    "env": "The game and how its frames reach the network.",
    "run": "Budgets, seeds, checkpoints and logging of the run.",
    "node": "One rank's machinery (the paper's node): how it acts and batches experience.",
    "model": "The network.",
    "algo": "The learning algorithm and its loss.",
    "dqn": "DQN's replay memory, target network and exploration (with `algo.name = \"dqn\"`). "
           "Counts are per rank, in agent steps unless named frames.",
    "optim": "The optimizer and gradient clipping.",
    "sync": "How ranks combine their gradients.",
    "central": "Central inference (`sync.mode = \"central\"`, SEED RL): rank 0 infers for every "
               "actor rank and trains; actor ranks only simulate.",
    "eval": "Greedy evaluation of frozen weights on rank 0.",
    "debug": "Faults injected on purpose, for the straggler benchmark and the fault tests.",
}

DOCS = {
    "env.id": "gymnasium id: `ALE/<Game>-v5` (ale-py ships the ROMs) or classic control such "
              "as `CartPole-v1`",
    "env.sticky": "sticky-action probability (Machado et al. 2018)",
    "env.frame_skip": "emulator frames per agent step (max over the last two)",
    "env.noop_max": "up to this many no-ops at reset",
    "env.fire_reset": "press FIRE at reset in games that need it",
    "env.episodic_life": "training only: a lost life ends the value chain (the game goes on)",
    "env.clip_rewards": "training only: rewards clipped to [-1, 1]",
    "env.max_episode_frames": "frame cap per game; a capped game is truncated, not terminated "
                              "(its value chain ends on the critic's estimate)",
    "env.size": "side of the square gray frames; 64 costs the nets less than half the compute "
                "of 84",
    "env.decorrelate": "start-state decorrelation: each simulator first takes a random number "
                       "(up to this) of random actions; they stay part of its first game",
    "env.env_threads": "C++ threads of each ale-py vector env",
    "env.observe": "classic control: the indices of the state the observation shows ([]: all); "
                   "CartPole's positions alone, [0, 2], need a recurrent net",
    "run.seed": "all seeds (per rank, simulator, evaluation) derive from it",
    "run.max_frames": "stop after this many emulator frames (all ranks together)",
    "run.max_minutes": "stop after this many minutes of training (0: no limit)",
    "run.checkpoint_minutes": "minutes between periodic checkpoints (written off the training "
                              "thread)",
    "run.keep_checkpoints": "periodic checkpoints kept",
    "run.storage_retry_seconds": "a checkpoint whose write fails with an error that may pass "
                                 "(EIO, ESTALE, ENOTCONN, ETIMEDOUT: an NFS fail-over) is "
                                 "tried once more after this many seconds",
    "run.log_every": "updates per `/train` row",
    "run.progress_seconds": "seconds between progress lines",
    "run.tensorboard": "TensorBoard event files written live beside the log in `RUN_DIR/tensorboard/`",
    "run.wandb": "Weights & Biases project that rank 0 mirrors the same scalars into, live, one "
                 "W&B run per run directory, a resume continuing it (`pip install ddrl[wandb]`; "
                 "`WANDB_MODE=offline` keeps it in `RUN_DIR/wandb/`); empty: none",
    "node.mode": "`ba3c`: asynchronous predictors and a FIFO (the paper); `a2c`: synchronous, "
                 "reproducible; `dqn`: samplers, a replay memory and a target network (chosen "
                 "by `algo.name = \"dqn\"`)",
    "node.n_sim": "simulators per rank",
    "node.batch_size": "data points per update per rank (ba3c; DQN's minibatch; in a2c it is "
                       "`n_sim x t_max`)",
    "node.t_max": "steps per segment or rollout: the n of n-step returns",
    "node.predictors": "predictor threads (ba3c; each owns `n_sim / predictors` simulators)",
    "node.predict_batch": "simulators per inference batch (0: half of a predictor's "
                          "simulators, or all of them with several predictors)",
    "node.queue_size": "FIFO capacity in data points (0: 4 x batch_size)",
    "node.threads": "TensorFlow threads (0: `SLURM_CPUS_PER_TASK`, `OMP_NUM_THREADS`, or the "
                    "cores of the affinity mask shared by the host's ranks)",
    "model.arch": "`ddrl` (the paper's 4-conv net), `nature` (Nature CNN), `a3c` (small A3C "
                  "net), `mlp` (vector observations)",
    "model.fc": "FC width of the `ddrl` net (the paper shrank it to 128)",
    "model.hidden": "MLP layer widths",
    "model.precision": "`float32`, `bfloat16` (Keras mixed precision; pays only where the CPU "
                       "has AMX) or `auto` (bfloat16 for image nets on a CPU with AMX-BF16, "
                       "else float32)",
    "algo.name": "`a2c`: n-step advantage actor-critic (BA3C on the ba3c node); `ppo`; "
                 "`vtrace`: IMPALA's actor-critic on V-trace targets; `appo`: PPO's clipped "
                 "loss on V-trace targets; `dqn`",
    "algo.gamma": "discount",
    "algo.entropy": "entropy bonus weight (actor-critic algorithms)",
    "algo.value_coef": "value-loss weight (actor-critic algorithms)",
    "algo.ratio_clip": "PPO, APPO: clip range of the probability ratio (and of the value change)",
    "algo.gae_lambda": "PPO: GAE's lambda",
    "algo.epochs": "PPO, APPO: passes over each batch; every minibatch is one update",
    "algo.minibatches": "PPO, APPO: minibatches per pass",
    "algo.normalize": "PPO, APPO: advantages normalised (to mean 0, deviation 1)",
    "algo.normalize_over": "PPO, APPO: normalise over each minibatch (CleanRL's) or over each "
                           "rank's rollout once (steadier when a rank's share of a minibatch "
                           "is small)",
    "algo.clip_value": "PPO, APPO: value loss clipped around the acting values",
    "algo.rho_clip": "V-trace: truncation of the importance weights pi/mu in the targets "
                     "(rho-bar)",
    "algo.c_clip": "V-trace: truncation of the importance weights in the trace (c-bar)",
    "algo.recurrent": "actor-critic algorithms on the a2c or ba3c node (central mode's too): "
                      "units of an LSTM between the torso and the actor-critic head (0: none); "
                      "a sequence is each simulator's rollout (a2c) or segment of node.t_max "
                      "steps (ba3c), unrolled from the state it was acted from",
    "dqn.replay_frames": "replay memory capacity per rank, in frames (each stored once)",
    "dqn.prepopulate": "agent steps of uniformly random play before learning",
    "dqn.target_period": "agent steps between target-network updates (C)",
    "dqn.train_period": "agent steps per minibatch (F)",
    "dqn.n_step": "steps of the return before the target network's bootstrap",
    "dqn.double": "Double DQN's target",
    "dqn.dueling": "the dueling head",
    "dqn.eps_start": "epsilon-greedy exploration at the first learning step",
    "dqn.eps_final": "epsilon after `eps_steps`",
    "dqn.eps_steps": "agent steps of learning over which epsilon is annealed linearly",
    "dqn.concurrent": "the samplers act with the target network on a thread of their own "
                      "while the trainer trains (the concurrent-DQN paper's Algorithm 1)",
    "dqn.samplers": "simulators per rank (W)",
    "dqn.synchronized": "the W simulators step in lock-step with one batched inference per "
                        "step; false: each on its own thread",
    "dqn.save_replay": "each rank saves its replay memory with the final checkpoint of a stop "
                       "and `--resume` restores it (gigabytes per rank at 1M frames)",
    "dqn.prioritized": "prioritized replay: transitions drawn in proportion to priority^alpha "
                       "(the last |TD error|, or the cross-entropy of a categorical head), "
                       "losses weighted by importance weights",
    "dqn.priority_alpha": "prioritized replay: exponent of the priorities (0: uniform)",
    "dqn.priority_beta": "prioritized replay: importance-weight exponent at the start, annealed "
                         "linearly to 1 over `run.max_frames`",
    "dqn.atoms": "Categorical DQN: atoms of each action's return distribution (0: Q-values; "
                 "C51: 51)",
    "dqn.v_min": "Categorical DQN: the lowest atom",
    "dqn.v_max": "Categorical DQN: the highest atom",
    "dqn.value_rescale": "R2D2's value rescaling h(x) = sign(x)(sqrt(|x|+1)-1) + 0.001x of the "
                         "n-step targets, for unclipped rewards",
    "dqn.recurrent": "R2D2: units of the LSTM between the torso and the Q head (0: no LSTM; "
                     "R2D2: 512); training on replayed sequences",
    "dqn.sequence": "R2D2: steps of each replayed sequence the loss learns on (R2D2: 80)",
    "dqn.burn_in": "R2D2: steps before each sequence that only refresh its stored recurrent "
                   "state (R2D2: 40)",
    "dqn.sequence_period": "R2D2: a simulator starts a sequence every this many steps (R2D2: "
                           "40: sequences overlap by half)",
    "dqn.priority_eta": "R2D2: a sequence's priority, eta max + (1 - eta) mean of its |TD "
                        "errors|",
    "optim.optimizer": "`adam`, or `rmsprop`: centered RMSProp (decay `beta2`, `eps` under the "
                       "root), as Nature DQN",
    "optim.lr": "learning rate",
    "optim.eps": "Adam epsilon (TF1's \"epsilon hat\")",
    "optim.beta1": "Adam's first-moment decay (the paper tuned 0.8)",
    "optim.beta2": "Adam's second-moment decay (the paper tuned 0.75)",
    "optim.clip_per_tensor": "clipping of each tensor's gradient by its average norm, as in the "
                             "authors' code (0: off)",
    "optim.max_grad_norm": "clipping by the global norm of each rank's gradient (0: off; PPO's "
                           "usual 0.5)",
    "optim.lr_scaling": "`none`, `sqrt` or `linear` in the number of workers",
    "optim.warmup_frames": "the learning rate rises linearly from 0 over this many frames (all "
                           "ranks together) at the run's start; 0: no warm-up",
    "optim.lr_schedule": "`constant`, or `linear`: decays to 0 at `run.max_frames` (all-reduce "
                         "mode)",
    "sync.backend": "`mpi` (mpi4py Allreduce), `horovod`, or `none` (one rank)",
    "sync.mode": "`allreduce`; `ps` (parameter-server ranks); `central` (rank 0 infers and "
                 "trains, the other ranks simulate: SEED RL)",
    "sync.ps": "parameter-server ranks (ps mode): the last ranks of the job",
    "sync.aggregate": "gradients per update: a fraction of the workers or a count (k of n; ps "
                      "mode)",
    "sync.async": "ps mode: apply every gradient as it arrives",
    "sync.timeout": "seconds a rank waits for the others before it takes them as frozen or "
                    "lost: all-reduce mode ends the job (exit 4), ps mode leaves the worker out",
    "sync.virtual_ranks": "rehearsal: ranks of the job each process carries (their simulators "
                          "and seeds, one model, gradients combined as the job's all-reduce "
                          "would): `mpirun -n N` runs a job of N x this many ranks",
    "sync.startup_timeout": "seconds the start-up's collectives wait at least (the larger of "
                            "this and `sync.timeout`): ranks reach them as their imports end",
    "central.groups": "groups of `node.n_sim` simulators per actor rank, each with one step in "
                      "flight: while one waits for its actions the others step",
    "central.batch": "observations per inference batch on the learner (0: all actor "
                     "simulators / `central.groups`)",
    "central.deadline_ms": "a batch closes this long after its first observation arrived, "
                           "full or not, so no actor waits long",
    "eval.every": "updates between evaluations (rank 0's evaluator process, frozen weights); "
                  "with a target, those skipped while it played are played once it is hit",
    "eval.episodes": "whole games per evaluation, unclipped rewards, no episodic life (0: none)",
    "eval.nice": "the evaluator process's niceness (0-19); at 19 it plays on the CPU time the "
                 "ranks leave idle and costs them little (docs/performance.md)",
    "eval.cpu_share": "the evaluator's CPU time, at most this share of one rank's cores: in a "
                      "synchronous job what it takes from a rank holds back all (an evaluation "
                      "due waits until it fits; 1: no limit)",
    "eval.confirm_episodes": "games the weights that cross `eval.target` play in all before the "
                             "run counts the target reached (the paper's 50; the rest played "
                             "at once, their mean over all of them must be at the target)",
    "eval.max_return": "the most one game can score (Pong: 21): an evaluation stops once even "
                       "that in every game left could not bring its mean to `eval.target` "
                       "(`none`: all are played)",
    "eval.pause_to_confirm": "while a crossing of `eval.target` plays its confirmation, every "
                             "rank waits (all-reduce placements), so the evaluator has the "
                             "cores and the run knows at once",
    "eval.focus_above": "once a live evaluation scores this much, each later one pauses the "
                        "ranks and plays on all the job's cores on the machine, so the run "
                        "knows within seconds whether its newest weights cross the target "
                        "(`none`: never)",
    "eval.pause_share": "the ranks wait for focused evaluations at most this share of the "
                        "run's wall time; one due beyond it waits until the share allows it, then "
                        "plays the newest weights (confirmations not counted)",
    "eval.backfill": "after a crossing is confirmed, or a budget ends without one, play the "
                     "weights the evaluator had no time for, to find the earliest at the target "
                     "(earlier, known later); false: the run stops once it knows",
    "eval.target": "stop when an evaluation's mean reaches this score (`none`: never)",
    "eval.epsilon": "probability of a random action in evaluation (0: greedy, as in the paper; "
                    "DQN's convention is 0.05)",
    "debug.slow_ranks": "ranks slowed down on purpose (straggler experiments)",
    "debug.slow_factor": "how much slower those ranks compute",
    "debug.freeze_rank": "this rank stops itself (SIGSTOP) before the sync of "
                         "`freeze_update` (an actor rank: before its step of that number), "
                         "as a host hung in its own work would (-1: none)",
    "debug.freeze_update": "the update at which `freeze_rank` stops itself; -1: at start-up, "
                           "before the initial weights are shared; -2: after the last update, "
                           "before the final barrier; -3: before the placement's start-up "
                           "(central mode's split)",
    "debug.freeze_mid_step": "a central-mode `freeze_rank` stops between a step's head and its "
                             "observations, as a host hung mid-send would",
    "debug.freeze_seconds": "a central-mode `freeze_rank`, or one frozen at start-up, sleeps "
                            "this many seconds instead (its other threads go on; 0: it "
                            "stops for ever)",
}


def reference_markdown() -> str:
    """The configuration reference page: every key with its type, default, allowed values and
    meaning, section by section, then the renamed keys."""
    import dataclasses
    import typing

    from ddrl.config import _CHOICES, _RANGES, RENAMED, Config, _key

    cfg = Config()
    lines = ["# Configuration reference", "",
             "Job files are TOML with the sections below; `ddrl train JOB --set section.key=value`",
             "overrides any key (values are TOML literals: `--set model.hidden=[128,128]`,",
             "`--set eval.target=none`). The run directory's `config.toml` holds the resolved",
             "config. This page is generated from the code (`ddrl/config.py`, "
             "`ddrl/config_docs.py`).", ""]
    for sec in dataclasses.fields(cfg):
        section = getattr(cfg, sec.name)
        hints = typing.get_type_hints(type(section))
        lines += [f"## `[{sec.name}]`", "", SECTIONS[sec.name], "",
                  "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
        for f in dataclasses.fields(section):
            key = f"{sec.name}.{_key(f)}"
            default = getattr(section, f.name)
            lines.append(f"| `{key}` | {_type_name(hints[f.name])} | `{_literal(default)}` | "
                         f"{_allowed(key, _CHOICES, _RANGES)} | {DOCS[key]} |")
        lines.append("")
    lines += ["## Renamed keys", "",
              "Old names still work, with a one-line note on standard error; `ddrl analyze`",
              "compares old logs' settings under the new names.", "",
              "| old key | new key |", "|---|---|"]
    lines += [f"| `{old}` | `{new}` |" for old, new in RENAMED.items()]
    return "\n".join(lines) + "\n"


def _type_name(typ) -> str:
    return getattr(typ, "__name__", str(typ)).replace("typing.", "").replace("NoneType", "none")


def _literal(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, int) and abs(value) >= 10_000:
        return f"{value:_}"
    return repr(value)


def _allowed(key: str, choices: dict, ranges: dict) -> str:
    if key in choices:
        return ", ".join(f"`{c}`" for c in choices[key])
    if key not in ranges:
        return ""
    low, high, low_incl = ranges[key]
    parts = []
    if low is not None:
        parts.append(f"{'>=' if low_incl else '>'} {low:g}")
    if high is not None:
        parts.append(f"<= {high:g}")
    return ", ".join(parts)
