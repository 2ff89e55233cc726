"""`ddrl bench KIND ...`: benchmarks that print figures (ratios measured in one run) rather
than timed unit tests, since shared machines are noisy. One module per benchmark."""
from __future__ import annotations

import argparse
import importlib

# kind -> module under ddrl.bench with `add_arguments(parser)` and `run(args) -> int`.
KINDS = {
    "node": ("ddrl.bench.node", "throughput of one node (or N ranks) for a job file"),
    "allreduce": ("ddrl.bench.allreduce", "time per all-reduce of each sync backend"),
    "ps": ("ddrl.bench.psexchange", "time per parameter-server exchange (gradient slices "
                                    "out, new slices back)"),
    "compare-sb3": ("ddrl.bench.sb3", "ddrl vs Stable-Baselines3 A2C on the same game and net"),
    "stragglers": ("ddrl.bench.stragglers", "update rate with a slowed rank: k-of-n vs full sync"),
    "offpolicy": ("ddrl.bench.offpolicy", "a2c vs V-trace on the ba3c node under heavy policy lag"),
    "scaling": ("ddrl.bench.scaling", "a model of sync cost vs nodes, checked on simulated "
                                      "hosts, predicted to 64 nodes"),
    "project": ("ddrl.bench.project", "minutes to the target on 1-256 nodes, from measured "
                                      "frames-to-score, frames/s per core and the sync model"),
    "central": ("ddrl.bench.central", "central inference against per-rank inference on "
                                      "simulated hosts: frames/s, bytes per frame, batches"),
    "dqn": ("ddrl.bench.dqn", "the concurrent-DQN paper's speed test: standard, concurrent, "
                              "synchronized, both, at W samplers"),
    "eval": ("ddrl.bench.evalcost", "the background evaluation's cost: frames/s with it off and "
                                    "on, alternating"),
    "paused-eval": ("ddrl.bench.pausedeval", "seconds per evaluation while the ranks wait: the "
                                             "simulators' layouts side by side, a run's weights"),
    "target": ("ddrl.bench.target", "time to score: a job run to its target for several seeds, "
                                    "frames and minutes to it per seed and median"),
    "replay": ("ddrl.bench.replay", "prioritized against uniform replay: time per minibatch, "
                                    "per stored step, memory"),
    "policies": ("ddrl.bench.policies", "the scores to beat: random play and each action held, "
                                        "under the job's evaluation protocol"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="kind", required=True, metavar="KIND")
    for kind, (module, help_text) in KINDS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.add_arguments(sub.add_parser(kind, help=help_text))


def run(args: argparse.Namespace) -> int:
    return importlib.import_module(KINDS[args.kind][0]).run(args)
