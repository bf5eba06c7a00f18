"""schedc.runtime: executes schedc plans (plan.json) with torch.distributed under torchrun.

Modules, in the order a run uses them: options (command line), model (GPT pieces and their partition),
data (byte-level text batches), tensor_parallel (--tp: Megatron's layers, the scatter/gather of
pipeline messages), world (process groups), executor (the instruction interpreter),
watchdog, checkpoint, trace (Chrome trace, report, cost profile), train (the pipelined run),
reference (the one-process run), launch (`schedc run`), tasks (user task handlers).
This package imports nothing from the compiler but schedc.plan, schedc.ops, schedc.layout and
schedc.descriptions (the model library's lookup), and nothing heavy at import time.
"""
