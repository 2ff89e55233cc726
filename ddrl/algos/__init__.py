"""Losses and return computations of the learning algorithms."""
