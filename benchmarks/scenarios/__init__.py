"""Whole-cluster scenarios against peer set-ups (bench, cache pressure, PD, recovery)."""
