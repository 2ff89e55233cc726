"""The documentation's configuration reference, built from each key's one declaration in
config.py (`setting`: default, type, doc line, choices or bounds), the sections' lines below
and the renamed keys."""
from __future__ import annotations

SECTIONS = {
    "env": "The game and how its frames reach the network.",
    "run": "Budgets, seeds, checkpoints and logging of the run.",
    "acting": "One rank's machinery (the paper's node): how it acts and batches experience.",
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


def reference_markdown() -> str:
    """The configuration reference page: every key with its type, default, allowed values and
    meaning, section by section, then the renamed keys."""
    import dataclasses
    import typing

    from ddrl.config import _CHOICES, _RANGES, DOCS, RENAMED, RENAMED_SECTIONS, Config, _key

    cfg = Config()
    lines = ["# Configuration reference", "",
             "Job files are TOML with the sections below; `ddrl train JOB --set section.key=value`",
             "overrides any key (values are TOML literals: `--set model.hidden=[128,128]`,",
             "`--set eval.target=none`). The run directory's `config.toml` holds the resolved",
             "config. This page is generated from the code (`ddrl/config.py`).", ""]
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
    lines += [f"| `[{old}]` (the whole section) | `[{new}]` |" for old, new in RENAMED_SECTIONS.items()]
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
