"""The passes, in the order the driver runs them on a schedule: simulate (timing: its result), memory
(what every op holds, the peaks), fill (fill_gaps: one step of it), lower (the plan), compiled (what a
compile returns) and grid (ops described in diagnostics)."""
