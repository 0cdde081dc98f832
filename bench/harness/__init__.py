"""Helpers shared by every benchmark: datasets, timing, tools, report."""
