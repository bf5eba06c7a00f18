# The expert all-to-alls against the plan: an MoE layer's dispatch and combine run inside the stage's
# module (runtime/model/experts.py), and the plan declares them as ALL_TO_ALL instructions after the op
# (or overlapped half) that issues them, one pair standing for all the op's MoE layers
# (costmodel/experts.py's expert_collectives). Every ep rank runs the same plan, so the exchanges line
# up if each op issues exchanges exactly where the plan declares them: checked after each compute op,
# the op named in the error (the executor adds "while executing ...").
#
#   F stage=0 mb=0 / ALL_TO_ALL x 2     the forward must issue token exchanges (2 per MoE layer)
#   W stage=1 mb=0 (none declared)      the weight-gradient pass must issue none
from __future__ import annotations

from collections import Counter
from typing import Callable

from schedc.plan import COMPUTE, Instr, Opcode, Plan

from ..model.experts import Issued, Routed, expert_parameters
from .executor import flat_views


class ExchangeError(RuntimeError):
    """An op's expert all-to-alls differ from what the plan declares after it."""


def declared(program: list[Instr]) -> Counter:
    """The ALL_TO_ALL instructions declared after each compute unit of a step program, by (op, stage, mb)."""
    out: Counter = Counter()
    last: list[Instr] = []
    for instr in program:
        if instr.op == Opcode.ALL_TO_ALL:
            owner = next((u for u in last if (u.stage, u.mb) == (instr.stage, instr.mb)), None)
            if owner is not None:
                out[(owner.op, owner.stage, owner.mb)] += 1
        elif any(u.op in COMPUTE for u in instr.units()):
            last = list(instr.units())
    return out


def exchange_problem(plan: Plan, ep: int) -> str | None:
    """Why a plan does not fit --ep (None when it does): with ep > 1 it must declare the expert
    all-to-alls (compiled with --ep and the model), with ep 1 it must not."""
    has = any(i.op == Opcode.ALL_TO_ALL for steps in plan.ranks for step in steps for i in step)
    if ep > 1 and not has:
        return (f"--ep {ep}: the plan declares no ALL_TO_ALL, so its order is not checked against the experts' "
                f"all-to-alls; compile it with --cluster, --model and --ep {ep}")
    if ep == 1 and has:
        return ("the plan declares expert ALL_TO_ALLs (compiled with --ep): run it with the same --ep")
    return None


def check_exchanges(executor) -> None:
    """Wrap each compute handler of the executor so that the token exchanges an op issues are counted
    and compared with the plan's declared ALL_TO_ALLs."""
    tables = [declared(list(program)) for program in executor.plan.ranks[executor.world.plan_rank]]

    def checked(handler: Callable[[Instr], None]) -> Callable[[Instr], None]:
        def run(instr: Instr) -> None:
            Issued.take()
            handler(instr)
            issued = Issued.take()
            want = tables[executor.step_no % len(tables)][(instr.op, instr.stage, instr.mb)]
            if bool(issued) != bool(want) or issued % 2:
                raise ExchangeError(f"{instr.op} of stage {instr.stage}, microbatch {instr.mb} issued {issued} expert "
                                    f"all-to-all(s), but the plan declares {want} ALL_TO_ALL after it: the module's "
                                    "exchanges and the plan's order differ")
        return run

    wrap(executor, [op for op in COMPUTE if op in executor.table and op != Opcode.OVERLAP_F_B], checked)


def count_routed(executor) -> None:
    """Wrap the executor's F so that the MoE blocks count the tokens each forward routes (experts.Routed)."""
    def counting(handler: Callable[[Instr], None]) -> Callable[[Instr], None]:
        def run(instr: Instr) -> None:
            Routed.on = True
            try:
                handler(instr)
            finally:
                Routed.on = False
        return run

    wrap(executor, [Opcode.F], counting)


def wrap(executor, ops: list[str], make: Callable) -> None:
    """Replace the handlers of `ops` in the executor's method table (which OVERLAP_F_B's halves use)
    and in its bound step programs by make(handler)."""
    executor.table.update({op: make(executor.table[op]) for op in ops})
    executor.programs = [[(executor.table[instr.op] if instr.op in ops else handler, instr, freed)
                          for handler, instr, freed in program] for program in executor.programs]


def attach_expert_grads(stage) -> None:
    """The stage's flat gradient buffer laid out dense parameters first, then the routed experts', with
    `dense_grad` and `expert_grad` views of the two parts (the executor reduces the first over the data
    and context ranks, the second over the expert-data-parallel group)."""
    experts = {id(p) for p in expert_parameters(stage)}
    params = [p for p in stage.parameters() if p.requires_grad]
    ordered = [p for p in params if id(p) not in experts] + [p for p in params if id(p) in experts]
    flat, views = flat_views(ordered, 1, stage.flat_grad.dtype)
    for p, view in zip(ordered, views):
        p.grad = view
    split = sum(p.numel() for p in ordered if id(p) not in experts)
    stage.flat_grad, stage.dense_grad, stage.expert_grad = flat, flat[:split], flat[split:]
