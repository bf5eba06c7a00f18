"""schedc.runtime: executes schedc plans (plan.json) with torch.distributed under torchrun.

Packages, in the order a run uses them: process (options, launch: `schedc run`, world: process groups,
watchdog, plugins), model (gpt: the GPT pieces and their partition, data, tensor_parallel, kfac,
sharding, train: the pipelined run, reference: the one-process run) and execution (executor: the
instruction interpreter, its helpers, tasks, checkpoint, trace: Chrome trace, report, cost profile).
This package imports nothing from the compiler but schedc.plan, schedc.ops, schedc.layout and
schedc.descriptions (the model library's lookup), and nothing heavy at import time.
"""
