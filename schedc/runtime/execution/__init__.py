"""The runtime's execution of a plan: the executor and its instructions' helpers (lifetimes, overlap,
placed recomputation and offload, sequence chunks, recomputation, tasks), memory and trace
measurement, checkpoints."""
