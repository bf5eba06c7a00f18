"""The .sched grammar, shipped as package data."""
