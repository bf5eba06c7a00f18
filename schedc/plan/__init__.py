"""The plan: the contract between compiler and runtime (docs/plan-format.md).

`schedc.plan.format` holds what a plan is and how it is read and verified (Instr, Plan, load_plan, the
text form); this package re-exports it with the instruction kinds of schedc.ops. The runtime imports
this package and schedc.ops, nothing else of schedc. Writing a plan fast is `schedc.plan.write`.
"""
from ..ops import COMM, COMPUTE, NOT_COMPUTE, RECVS, SENDS, Opcode
from .format import (FORMAT, VERSION, Instr, Plan, PlanError, content_hash, format_rank_text,
                     parse_rank_text)
from .validate import check_plan_fields, load_plan, plan_from_json  # format's, with the fields checked

__all__ = ["COMM", "COMPUTE", "NOT_COMPUTE", "RECVS", "SENDS", "Opcode", "FORMAT", "VERSION", "Instr", "Plan",
           "PlanError", "content_hash", "format_rank_text", "load_plan", "parse_rank_text", "plan_from_json",
           "check_plan_fields"]
