"""ir: the IR's values are built once and equal their plain forms; the two speed tricks that fill Op
slots directly (ops_from_columns, set_spans) give exactly what the dataclass constructor and
dataclasses.replace give."""
from __future__ import annotations

from dataclasses import FrozenInstanceError, fields, replace

import pytest

from conftest import SCHEDULES, compile_library
from schedc.diagnostics import Span
from schedc.ir import OP_FIELDS, Op, Schedule, ops_from_columns, set_spans


def _all_fields(op: Op) -> tuple:
    return tuple(getattr(op, f.name) for f in fields(Op))


def test_ops_from_columns_are_the_ops_the_constructor_builds():
    span = Span(3, 4, 3, 9)
    rows = [dict(kind="F", stage=1, mb=2, pipe=0, part=0, device=1, cost=1.5, span=None, parts=1),
            dict(kind="kfac", stage=0, mb=None, pipe=1, part=2, device=0, cost=0.25, span=span, parts=4)]
    made = ops_from_columns(len(rows), *([row[name] for row in rows] for name in OP_FIELDS))
    plain = [Op(**row) for row in rows]
    assert list(map(_all_fields, made)) == list(map(_all_fields, plain))
    assert made == plain and list(map(hash, made)) == list(map(hash, plain))
    with pytest.raises(FrozenInstanceError):
        made[0].stage = 5  # still frozen


def test_set_spans_is_replace_without_the_copy():
    ops = [Op("F", s, 0, device=s, cost=2.0) for s in range(3)]
    spans = [Span(1, 1, 1, 2), None, Span(7, 3, 7, 5)]
    plain = [replace(op, span=span) for op, span in zip(ops, spans)]
    set_spans(ops, spans)
    assert list(map(_all_fields, ops)) == list(map(_all_fields, plain))


def test_placed_ops_carry_the_span_of_the_program_line_that_placed_them():
    schedule = compile_library("1f1b", p=2, m=2).schedule
    text = (SCHEDULES / "1f1b.sched").read_text().splitlines()
    for order in schedule.orders:
        for op in order:
            assert op.span is not None and text[op.span.line - 1].strip()[:1] in ("F", "B", "(")


def test_a_schedule_is_built_with_keywords_only():
    schedule = compile_library("gpipe", p=2, m=2).schedule
    with pytest.raises(TypeError):
        Schedule(*(getattr(schedule, f.name) for f in fields(Schedule)))
    assert Schedule(**{f.name: getattr(schedule, f.name) for f in fields(Schedule)}) == schedule


def test_a_schedule_title_names_its_params_or_only_the_schedule():
    assert compile_library("1f1b", p=2, m=4).schedule.title == "one_f_one_b (p=2 m=4)"
    assert replace(compile_library("1f1b", p=2, m=4).schedule, params={}).title == "one_f_one_b"
