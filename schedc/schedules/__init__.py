"""The library of .sched schedules, shipped as package data."""
