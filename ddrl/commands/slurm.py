"""`ddrl slurm`: print a ready sbatch script for a job file, rendered from the templates in
ddrl/slurm/ (package data; `slurm/` in the checkout links to it): the header from the
options, launch.sh inlined so the script stands alone.

`ddrl slurm --resolve` is the other half, run by those scripts inside the job: it decides what
this task trains (array seed or sweep line), where (run directory) and whether it resumes, and
prints the `ddrl train` arguments one per line. Keeping that policy here rather than in bash
makes it testable and lets a bad job file fail with one line before any MPI rank starts.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from pathlib import Path

from ddrl.commands.args import job_file, positive_int
from ddrl.errors import DdrlError
from ddrl.placement import load_job, placement_of
from ddrl.rundir import checkpoint, default_run_dir, hold

TEMPLATES = Path(__file__).resolve().parents[1] / "slurm"
LAUNCH_BLOCK = re.compile(r"^# >>> ddrl launch.*?^# <<< ddrl launch\n", re.M | re.S)
MAIN_CALL = 'ddrl_main "$@"\n'
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
_ARRAY = re.compile(r"\d+(-\d+(:\d+)?)?(,\d+(-\d+(:\d+)?)?)*(%\d+)?")
_MEM = re.compile(r"\d+[KMGT]?")
# What an #SBATCH value may hold: a newline would end the comment and run the rest as shell.
_NAME = re.compile(r"[\w.,:%@+=/-]+")
# The options that size the actors' component of a central-mode (heterogeneous) job.
_ACTOR_SIZES = ("--nodes", "--ntasks-per-node", "--cpus-per-task", "--mem")
# Slurm may send the warning signal up to a minute early, so the limit must leave time to train.
_SIGNAL_SLACK_S = 60


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOB.toml", type=job_file,
                        help="the job file, or a recipe's name (`ddrl recipes`)")
    parser.add_argument("--nodes", type=positive_int, help="nodes (-N)")
    parser.add_argument("--tasks-per-node", type=positive_int, help="ddrl ranks per node")
    parser.add_argument("--cpus-per-task", type=positive_int, help="cores per rank")
    parser.add_argument("--time", help="time limit, e.g. 04:00:00 or 1-00:00:00")
    parser.add_argument("--mem", help="memory per node, e.g. 64G")
    parser.add_argument("--partition", help="Slurm partition")
    parser.add_argument("--array", help="job array of seeds (or sweep lines), e.g. 0-9%%4")
    parser.add_argument("--sweep", metavar="FILE", type=job_file,
                        help="one run per line of `key=value ...` (and optionally a job file)")
    parser.add_argument("--gpus-per-node", type=positive_int, help="GPUs per node, one rank each")
    parser.add_argument("--learner-cpus", type=positive_int,
                        help="central mode: the learner's cores (--nodes etc. size the actors)")
    parser.add_argument("--learner-gpus", type=positive_int, help="central mode: the learner's GPUs")
    parser.add_argument("--job-name", help="Slurm job name (default: ddrl-<job file stem>)")
    parser.add_argument("--out", help="run directory (default: runs/<job>-<job id>)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override, repeatable")
    parser.add_argument("--resolve", action="store_true",
                        help="inside a Slurm job: print this task's `ddrl train` arguments")


def run(args: argparse.Namespace) -> int:
    if args.resolve:
        print("\n".join(task_train_args(args.job, args.set, args.out, args.sweep)))
    else:
        print(render(args), end="")
    return 0


# --- inside the job -------------------------------------------------------------------------

def sweep_lines(path: str | Path) -> list[list[str]]:
    """The runs of a sweep file: shell-like words per line, `#` comments and blank lines skipped."""
    path = Path(path)
    if not path.is_file():
        raise DdrlError(f"sweep file not found: {path}")
    runs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as exc:  # an unbalanced quote
            raise DdrlError(f"sweep file {path}, line {number}: {exc} ({line.strip()!r})") from None
        if words:
            runs.append(words)
    if not runs:
        raise DdrlError(f"sweep file {path} has no runs")
    return runs


def task_config(job: str, sets: list[str], sweep: str | None,
                task: int | None) -> tuple[str, list[str]]:
    """Job file and overrides of array task `task` (None outside arrays), validated."""
    sets = list(sets)
    if sweep is not None:
        if task is None:
            raise DdrlError("--sweep needs a job array (SLURM_ARRAY_TASK_ID is not set)")
        runs = sweep_lines(sweep)
        if task >= len(runs):
            raise DdrlError(f"sweep file {sweep} has {len(runs)} runs, none for array task {task}")
        for word in runs[task]:
            if word.endswith(".toml"):
                job = word
            else:
                sets.append(word)
    cfg = load_job(job, sets)
    if sweep is None and task is not None:
        # Arrays without a sweep are seed replicas: the job's seed plus the task id.
        sets.append(f"run.seed={cfg.run.seed + task}")
    return job, sets


def _set_aside_log_without_checkpoint(run_dir: Path) -> None:
    """A start that died before its first checkpoint (a rank or node lost early, then the
    job restarted or requeued) leaves a log and nothing to resume from: the task starts
    over, and the log is kept under another name rather than refused or overwritten."""
    log = run_dir / "log.h5"
    if not log.exists():
        return
    # Only under the run directory's lock: a live run (another job on a wrong --out, the old
    # step of a requeued job) has no checkpoint yet either, and renaming its log would leave
    # it unresumable. Held, it raises InUseError: the directory is not touched.
    held = hold(run_dir)
    try:
        n = 1
        while (kept := run_dir / f"log.before-restart-{n}.h5").exists():
            n += 1
        log.rename(kept)
    finally:
        held.close()
    print(f"ddrl: {log} has no checkpoint to resume from (its run ended before the first "
          f"one): kept as {kept.name}; the run starts over", file=sys.stderr)


def task_train_args(job: str, sets: list[str], out: str | None, sweep: str | None) -> list[str]:
    """`ddrl train` arguments of this Slurm task; its run directory never collides with
    another task's or job's, and a requeued job (same id) finds its own again."""
    env = os.environ
    if "SLURM_JOB_ID" not in env:
        raise DdrlError("--resolve runs inside a Slurm job (SLURM_JOB_ID is not set)")
    task = int(env["SLURM_ARRAY_TASK_ID"]) if "SLURM_ARRAY_TASK_ID" in env else None
    job, sets = task_config(job, sets, sweep, task)
    if out is None:
        run_dir = default_run_dir(job)
    else:
        run_dir = Path(out if task is None else f"{out}_{task}")
    return train_args(job, sets, run_dir)


def train_args(job: str, sets: list[str], run_dir: Path) -> list[str]:
    """`ddrl train` arguments that start the run in `run_dir`, or resume it from its last
    checkpoint where it has one."""
    run_dir = run_dir.absolute()
    resume = checkpoint.latest(run_dir / "checkpoints") is not None
    print(f"ddrl: run directory {run_dir}{' (resuming)' if resume else ''}", file=sys.stderr)
    if not resume:
        _set_aside_log_without_checkpoint(run_dir)
    args = [str(Path(job).absolute()), "--out", str(run_dir)] + ["--resume"] * resume
    for item in sets:
        args += ["--set", item]
    return args


# --- printing a script ----------------------------------------------------------------------

def _time_seconds(text: str) -> int:
    """Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    m = _TIME.fullmatch(text)
    if not m:
        raise DdrlError(f"--time {text!r}: expected HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = (int(g) if g else 0 for g in m.groups())
    if m.group(1) or m.group(4):
        hours, minutes, seconds = a, b, c
    else:
        hours, minutes, seconds = 0, a, b
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def _header(text: str) -> list[list[str | None]]:
    """The template's `#SBATCH --name=value` lines as [name, value] pairs, in order."""
    pairs = []
    for line in text.splitlines():
        if line.startswith("#SBATCH "):
            name, _, value = line.split(None, 1)[1].partition("=")
            pairs.append([name, value or None])
    return pairs


def _options(args: argparse.Namespace, stem: str, n_runs: int | None) -> dict[str, str]:
    opts = {"--job-name": args.job_name or f"ddrl-{stem}"}
    for flag, value in (("--nodes", args.nodes), ("--ntasks-per-node", args.tasks_per_node),
                        ("--cpus-per-task", args.cpus_per_task), ("--time", args.time),
                        ("--mem", args.mem), ("--partition", args.partition),
                        ("--array", args.array)):
        if value is not None:
            opts[flag] = str(value)
    for flag in ("--job-name", "--partition"):
        if flag in opts and not _NAME.fullmatch(opts[flag]):
            raise DdrlError(f"{flag} {opts[flag]!r}: use letters, digits and . , : % @ + = / - _")
    if args.mem is not None and not _MEM.fullmatch(args.mem):
        raise DdrlError(f"--mem {args.mem!r}: expected a size like 64G or 4000M")
    if args.array is not None:
        array_tasks(args.array, n_runs)
    if args.array is None and n_runs is not None:
        opts["--array"] = f"0-{n_runs - 1}"
    if args.gpus_per_node is not None:
        if args.tasks_per_node not in (None, args.gpus_per_node):
            raise DdrlError("--tasks-per-node must equal --gpus-per-node (one rank per GPU)")
        opts["--ntasks-per-node"] = str(args.gpus_per_node)
        opts["--gres"] = f"gpu:{args.gpus_per_node}"
    return opts


def array_tasks(spec: str, n_runs: int | None = None) -> list[int]:
    """The task indices of a Slurm `--array` value (`0-9`, `1,3,5`, `0-9:2`, `0-9%4`), in
    order; with a sweep's `n_runs`, each must name one of its lines."""
    if not _ARRAY.fullmatch(spec):
        raise DdrlError(f"--array {spec!r}: expected indices like 0-9, 1,3,5 or 0-9%4")
    tasks = set()
    for part in spec.split("%")[0].split(","):
        first, _, rest = part.partition("-")
        last, _, step = rest.partition(":")
        if (last and int(last) < int(first)) or (step and int(step) == 0):
            raise DdrlError(f"--array {spec!r}: the range {part} holds no task")
        part_tasks = range(int(first), int(last or first) + 1, int(step or 1))
        if n_runs is not None and part_tasks[-1] >= n_runs:
            raise DdrlError(f"--array {spec!r}: the sweep file has {n_runs} runs "
                            f"(tasks 0-{n_runs - 1})")
        tasks.update(part_tasks)
    return sorted(tasks)


def _check_time(header: list[list[str | None]]) -> None:
    values = dict(header)
    time, signal = values.get("--time"), values.get("--signal")
    if time in (None, "INFINITE", "UNLIMITED") or signal is None:
        return
    lead = int(signal.rpartition("@")[2])
    if _time_seconds(time) <= lead + _SIGNAL_SLACK_S:
        raise DdrlError(f"--time {time} is too short: the checkpoint warning comes {lead} s "
                        f"before the limit (--signal={signal}), and may come a minute early")


def _template_name(args: argparse.Namespace, own: str | None) -> str:
    """The placement's `own` template (central mode's heterogeneous job), else the options'."""
    if own:
        if args.gpus_per_node is not None or args.array is not None or args.sweep is not None:
            raise DdrlError("sync.mode = 'central' runs as a heterogeneous job: use "
                            "--learner-gpus for the learner's GPU; arrays and sweeps are "
                            "not supported for it")
        return own
    if args.learner_cpus is not None or args.learner_gpus is not None:
        raise DdrlError("--learner-cpus and --learner-gpus are for sync.mode = 'central'")
    if args.gpus_per_node is not None:
        return "dgx.sbatch"
    return "array.sbatch" if args.array is not None or args.sweep is not None else "train.sbatch"


def _validated_runs(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """Check the job file and overrides (each sweep line's); the number of sweep runs, and
    the template the job's placement needs whatever the options (central mode's)."""
    if args.sweep is None:
        cfg = load_job(args.job, args.set)
        return None, placement_of(cfg).slurm_template
    n_runs = len(sweep_lines(args.sweep))
    for task in range(n_runs):
        task_config(args.job, args.set, args.sweep, task)
    return n_runs, None


def _main_call(args: argparse.Namespace) -> str:
    """The template's `ddrl_main "$@"` with this job's arguments (absolute paths: the script
    may be submitted from anywhere) and the environment `ddrl slurm` runs in."""
    main = [str(Path(args.job).absolute())]
    if args.out is not None:
        main += ["--out", str(Path(args.out).absolute())]
    if args.sweep is not None:
        main += ["--sweep", str(Path(args.sweep).absolute())]
    for item in args.set:
        main += ["--set", item]
    call = ""
    if sys.prefix != sys.base_prefix and (Path(sys.prefix) / "bin" / "ddrl").exists():
        call += f'[ -n "${{DDRL_VENV:-}}" ] || DDRL_VENV={shlex.quote(sys.prefix)}\n'
    return call + f'ddrl_main {shlex.join(main)} "$@"\n'


def render(args: argparse.Namespace) -> str:
    """The sbatch script for these options."""
    if not (TEMPLATES / "launch.sh").is_file():
        raise DdrlError(f"batch script templates not found in {TEMPLATES}: the ddrl install "
                        "is incomplete; reinstall it")
    n_runs, own = _validated_runs(args)
    central = own is not None  # a heterogeneous job: the actors' sizes go in their component
    template = (TEMPLATES / _template_name(args, own)).read_text()
    header = _header(template)
    opts = _options(args, Path(args.job).stem, n_runs)
    learner = {"--cpus-per-task": args.learner_cpus,
               "--gres": args.learner_gpus and f"gpu:{args.learner_gpus}"}
    # A heterogeneous job's header is one block per component, `hetjob` between them: the
    # job's own options and the learner's go in the first, the actors' sizes in the last.
    blocks = [[]]
    for pair in header:
        blocks.append([]) if pair[0] == "hetjob" else blocks[-1].append(pair)
    placed = [(blocks[-1] if central and name in _ACTOR_SIZES else blocks[0], name, value)
              for name, value in opts.items()]
    placed += [(blocks[0], name, str(value)) for name, value in learner.items() if value]
    for block, name, value in placed:
        found = next((pair for pair in block if pair[0] == name), None)
        if found:
            found[1] = value
        else:
            block.append([name, value])
    header = [pair for i, block in enumerate(blocks)
              for pair in [*([["hetjob", None]] if i else []), *block]]
    _check_time(header)

    body = template[template.rindex("#SBATCH "):].split("\n", 1)[1]
    body = LAUNCH_BLOCK.sub(lambda _: (TEMPLATES / "launch.sh").read_text(), body)
    body = body.replace(MAIN_CALL, _main_call(args))
    lines = ["#!/bin/bash",
             # repr: a newline in the path must not end the comment.
             f"# Printed by `ddrl slurm` for {str(Path(args.job).absolute())!r}.",
             "# Submit with `sbatch SCRIPT`; its arguments (--set key=value ...) add to these.",
             *(f"#SBATCH {name}" + (f"={value}" if value is not None else "")
               for name, value in header)]
    return "\n".join(lines) + "\n" + body
