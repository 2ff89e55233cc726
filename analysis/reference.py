"""Published scores to draw beside a run's curve: CSV files with `label,frames,score` rows
(`#` lines are comments). `--reference pong` names a file shipped in analysis/references/."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ddrl.errors import DdrlError

SHIPPED = Path(__file__).resolve().parent / "references"
COLUMNS = ("label", "frames", "score")


def shipped_names() -> list[str]:
    return sorted(p.stem for p in SHIPPED.glob("*.csv"))


def load_reference(name_or_path: str) -> pd.DataFrame:
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = SHIPPED / f"{name_or_path}.csv"
        if not path.is_file():
            raise DdrlError(f"--reference {name_or_path}: no such file, and no shipped reference "
                            f"of that name (shipped: {', '.join(shipped_names())})")
    if not path.is_file():
        raise DdrlError(f"--reference {name_or_path}: no such file")
    try:
        table = pd.read_csv(path, comment="#", skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise DdrlError(f"--reference {path}: not a CSV file ({exc})") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise DdrlError(f"--reference {path}: missing column(s) {', '.join(missing)} "
                        f"(expected {','.join(COLUMNS)})")
    for col in ("frames", "score"):
        values = pd.to_numeric(table[col], errors="coerce")
        if values.isna().any():
            row = int(values.isna().to_numpy().argmax()) + 1
            raise DdrlError(f"--reference {path}: row {row}: {col} is not a number")
        table[col] = values
    return table[list(COLUMNS)].sort_values(["label", "frames"], kind="stable")
