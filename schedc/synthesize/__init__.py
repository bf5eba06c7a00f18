"""The synthesis of a per-device order under a memory limit (`schedc tune --synthesize`): problem (what
to order, its costs and limit), scheduler (the list scheduler), local_search (the timer and the moves),
sched_text (the .sched writer), options (the command line's options to a problem and its report)."""
