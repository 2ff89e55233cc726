"""Argument types the commands share (argparse turns their errors into one usage line)."""
from __future__ import annotations

import argparse

from ddrl import recipe


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def job_file(text: str) -> str:
    """A job file's path, or the name of a recipe that comes with ddrl (`ddrl recipes`)."""
    return recipe.resolve(text)
