"""parse: the grammar accepts the library and reports syntax errors with file:line:col and a caret."""
from __future__ import annotations

import pytest

from conftest import FIXTURES, SCHEDULES
from schedc.frontend import ast
from schedc.diagnostics import SchedError, Source
from schedc.frontend.parse import ToAst, decode_source, parse_source


@pytest.mark.parametrize("path", sorted(SCHEDULES.glob("*.sched")), ids=lambda p: p.name)
def test_library_parses(path):
    decl = parse_source(Source(str(path), path.read_text()))
    assert decl.doc and any(isinstance(d, (ast.Param, ast.Extends)) for d in decl.decls)  # its own or a base's


def _error(text: str) -> SchedError:
    with pytest.raises(SchedError) as caught:
        parse_source(Source("t.sched", text))
    return caught.value


def test_syntax_error_points_at_the_unexpected_token():
    exc = _error("schedule x\nparam p = 2\npipeline main { stages p; device s -> s; microbatches 4 }\n"
                 "on device d { F * 4 ; B * 4 } }\n")
    assert exc.exit_code == 2
    assert exc.render().splitlines()[0].startswith("t.sched:4:31: error: unexpected '}'")
    assert exc.render().splitlines()[2] == " " * 32 + "^"


@pytest.mark.parametrize("fixture,opening,stopped", [
    ("paren.sched", "(", "7:3: the parser stopped here: unexpected 'F'"),
    ("square.sched", "[", "7:3: the parser stopped here: unexpected 'F'"),
    ("brace.sched", "{", "4:1: the parser stopped here: unexpected 'on'"),
    ("at_end.sched", "{", "5:16: the parser stopped here: unexpected end of file"),  # closed at the end
])
def test_an_unclosed_bracket_is_reported_where_it_opens(fixture, opening, stopped):
    text = (FIXTURES / "unclosed" / fixture).read_text()
    exc = _error(text)
    diag = exc.diagnostics[0]
    # the bracket, found here by hand: the last `opening` of the first line that opens one and never
    # closes it on that line
    number, line = next((n, ln) for n, ln in enumerate(text.splitlines(), 1)
                        if ln.count(opening) > ln.count({"(": ")", "[": "]", "{": "}"}[opening]))
    assert exc.exit_code == 2 and diag.message == f"{opening!r} is not closed"
    assert (diag.span.line, diag.span.column) == (number, line.rindex(opening) + 1)
    assert diag.notes[0].startswith(f"t.sched:{stopped}")
    closed = text.splitlines()
    if "end of file" in stopped:
        closed.append("}")
    else:  # closed on its own line: the fix the error points at
        closed[number - 1] += {"(": ")", "[": "]", "{": " }"}[opening]
    parse_source(Source("t.sched", "\n".join(closed) + "\n"))


@pytest.mark.parametrize("text", [
    "schedule x\nparam p = 2\nqueue F by (i +\n  * s)\n",                 # an error inside, closed later
    "schedule x\nparam p = min(2, 3\nparam m = max(1, 2))\n",               # closed, by a later ')'
    "schedule x\nparam p = min(2 # (\n, 3) \"(\" )\n",                     # a '(' in a comment or string
])
def test_a_bracket_that_is_closed_somewhere_is_not_blamed(text):
    assert "is not closed" not in _error(text).render()


def test_a_bracket_open_over_several_lines_parses():
    decl = parse_source(Source("t.sched", "schedule x\nparam p = min(2,\n  3)\n"))
    assert decl.decls


@pytest.mark.parametrize("text,line,column", [
    ("schedule x\nparam p = 4 $", 2, 13),
    ("schedule x\nparam p = ", 2, 11),
    ("schedule x\non device d { F * }", 2, 19),
    ("schedule x \"doc\"\npipeline { stages 2 }", 2, 10),
])
def test_error_locations(text, line, column):
    diag = _error(text).diagnostics[0]
    assert (diag.span.line, diag.span.column) == (line, column)


def test_empty_file():
    assert "empty file" in _error("  \n").render()


def test_non_utf8_bytes_are_located():
    with pytest.raises(SchedError) as caught:
        decode_source(b"schedule x\nparam p = 4 \"\xff\"\n", "bad.sched")
    assert caught.value.exit_code == 2
    assert caught.value.diagnostics[0].span.line == 2


def test_a_byte_order_mark_is_dropped_and_columns_count_without_it():
    text = decode_source(b"\xef\xbb\xbfschedule x\nparam p = $\n", "bom.sched").text
    assert text.startswith("schedule x")
    assert (_error(text).diagnostics[0].span.line, _error(text).diagnostics[0].span.column) == (2, 11)


def test_deep_nesting_is_refused_without_recursion_error():
    exc = _error("schedule x\nparam p = " + "(" * 5000 + "1" + ")" * 5000)
    assert "nesting" in exc.render()


def test_spans_cover_the_whole_rule():
    decl = parse_source(Source("t.sched", "schedule x\nparam p = 4 \"devices\"\n"))
    param = decl.decls[0]
    assert (param.span.line, param.span.column, param.span.end_column) == (2, 1, 22)
    assert param.doc == "devices"


def test_comments_semicolons_and_layout_are_free():
    one = parse_source(Source("a", "schedule x\nparam p = 2 ; param m = 4 # two params\n"))
    two = parse_source(Source("b", "schedule x\nparam p = 2\n\nparam m = 4\n"))
    assert [d.name for d in one.decls] == [d.name for d in two.decls] == ["p", "m"]


def test_expressions_follow_usual_precedence():
    from schedc.frontend.expr import evaluate
    decl = parse_source(Source("t", "schedule x\nparam a = 2 + 3 * 4 ** 2 // 5 - -1 if not 1 > 2 and 3 >= 3 else 0"))
    assert evaluate(decl.decls[0].default, {}) == 2 + 3 * 4 ** 2 // 5 + 1


@pytest.mark.parametrize("fixture,line,column,hint", [
    ("group_after_op.sched", 4, 20, "put ';' before a group that follows an op: F ; (F B)"),
    ("overlap_after_op.sched", 5, 20, "a '(' right after an op is read as its arguments"),
    ("choice_after_op.sched", 10, 5, "a '(' right after an op is read as its arguments"),  # after B[0]
    ("let_then_if.sched", 6, 12, "an 'if' right after a let's value is read as part of it"),
    ("if_after_item.sched", 5, 11, "put ';' before an if-statement that follows an item"),
])
def test_the_two_longer_readings_get_a_hint(fixture, line, column, hint):
    exc = _error((FIXTURES / fixture).read_text())
    diag = exc.diagnostics[0]
    assert (diag.span.line, diag.span.column) == (line, column)
    assert any(hint in note for note in diag.notes)


def test_a_repeat_count_that_is_an_expression_gets_a_hint():
    exc = _error((FIXTURES / "repeat_count_expression.sched").read_text())
    diag = exc.diagnostics[0]
    assert (diag.span.line, diag.span.column) == (5, 21) and diag.message.startswith("unexpected '-'")
    assert diag.notes == ("a repeat count is one atom (a name, a number or a parenthesized expression): "
                          "write * (m - 1), not * m - 1",)
    assert exc.exit_code == 2
    assert not _error("schedule x\non device d { F * 2 ; - }").diagnostics[0].notes  # not after a count


def test_no_hint_for_an_ordinary_argument_error():
    assert not _error("schedule x\nparam p = min (1 2)").diagnostics[0].notes
    assert not _error("schedule x\non device 0 { F (0 1) }").diagnostics[0].notes  # a missing comma


def test_the_run_token_is_not_named_in_what_was_expected():
    message = _error('schedule x "x"\non device 0 { F(0, 0) ) }').render().splitlines()[0]
    assert message.endswith("expected one of '(', ';', 'for', 'if', 'let', '}', a name") and "op_run" not in message


@pytest.mark.parametrize("expr,message,column", [
    ("- " * 3000 + "1", "nested deeper than 200 levels", None),
    (" + ".join(["1"] * 3000), "nested deeper than 200 levels", None),
    ("not " * 3000 + "1", "nested deeper than 200 levels", None),
    ("1" + "0" * 5000, "has 5001 digits (at most 18)", 11),     # int() would refuse it past 4300 digits
    ("1e999", "number 1e999 is too large to be a finite number", 11),
])
def test_deep_or_huge_expressions_are_located_syntax_errors(expr, message, column):
    exc = _error(f'schedule x "x"\nparam p = {expr}\n')
    first = exc.render().splitlines()[0]
    assert exc.exit_code == 2 and message in first, first
    assert exc.diagnostics[0].span.line == 2
    assert column is None or exc.diagnostics[0].span.column == column
    assert "recursion" not in first and "rule" not in first


def test_deeply_nested_program_is_a_located_error():
    body = "(" * 150 + "F" + ")" * 150  # under the bracket limit; the groups nest 150 deep, items twice that
    exc = _error(f'schedule x "x"\non device d {{ {body} }}\n')
    assert exc.exit_code == 2 and exc.diagnostics[0].span.line == 2
    assert "nested deeper than 200 levels" in exc.render()


def _general_parser():
    """The grammar without its one-token rule for runs of literal ops: every op through the general rule."""
    from importlib import resources

    from lark import Lark

    from schedc.frontend.parse import GRAMMAR_FILE, GRAMMAR_PACKAGE
    text = resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE).read_text()
    general = text.replace(" | literal_run", "")
    lines = [line for line in general.splitlines() if "OP_RUN" not in line]
    assert general != text and len(lines) == len(text.splitlines()) - 2  # the rule and its terminal
    return Lark("\n".join(lines), parser="lalr", propagate_positions=True, maybe_placeholders=True)


@pytest.mark.parametrize("name", ["explicit_spacing.sched", "explicit.sched"])
def test_literal_ops_parse_as_the_general_rule_does(name):
    text = (FIXTURES / name).read_text()
    fast = parse_source(Source(name, text))
    general = ToAst().transform(_general_parser().parse(text))
    assert fast == general  # nodes and spans alike
    ops = [item.unit for d in fast.decls if isinstance(d, ast.Program) for item in d.body]
    assert len(ops) == (11 if name == "explicit_spacing.sched" else 8)  # a group is one item


@pytest.mark.parametrize("body", [
    "F(0, 1) * 2 B(0, 1)", "F(0, 0)? F(0, 1)", "F(0, 0) F(0, 1) at 3", "F(0, 1) if 1 > 0 B(0, 1)",
    "F(0, 1) if k > 0 ; B(0, 1)", "(F(0, 1) | B(0, 1)) F(0, 2)", "F(0, 0) F(0, 1) & B(0, 0) W(0, 0)",
    "F(0, 0) (B(0, 0))", "F(0,0)F(0,1) atx(0, 1)", "F(0, 0) iff(1, 2)", "for k in 0 .. 2 { F(0, 0) F(0, 1) }",
])
def test_an_op_with_something_after_it_leaves_the_run(body):
    text = f'schedule x "x"\non device 0 {{ {body} }}\n'
    assert parse_source(Source("t.sched", text)) == ToAst().transform(_general_parser().parse(text))


def test_literal_op_with_a_huge_microbatch_is_located():
    exc = _error('schedule x "x"\non device 0 { F(0, 1' + "0" * 30 + ") }\n")
    assert "has 31 digits (at most 18)" in exc.render().splitlines()[0]
    assert (exc.diagnostics[0].span.line, exc.diagnostics[0].span.column) == (2, 20)  # the number's own column



def test_the_run_token_leaves_out_every_keyword_of_the_grammar():
    """NOT_KEYWORD lists the grammar's keywords: `if(0, 1)` or `at(0, 1)` after an op is not an op."""
    import re
    from importlib import resources

    from schedc.frontend.parse import GRAMMAR_FILE, GRAMMAR_PACKAGE
    text = resources.files(GRAMMAR_PACKAGE).joinpath(GRAMMAR_FILE).read_text()
    listed = re.search(r"^NOT_KEYWORD: /\(\?!\(\?:([a-z|]+)\)", text, re.M).group(1).split("|")
    assert listed == sorted(set(re.findall(r'"([a-z]+)"', text)))


def _program_bodies():
    """Program bodies of literal ops mixed with every construct that may follow or hold one: spaces of
    every kind the grammar knows, comments, keywords as names, suffixes, overlaps, choices, groups,
    loops and ifs."""
    from hypothesis import strategies as st
    space = st.sampled_from([" ", "  ", "\n", "\t", "", "\r\n", " # c\n", "#x\n", "\f"])
    name = st.sampled_from(["F", "B", "W", "I", "atx", "iff", "on", "t_1", "at_", "at", "if", "for", "let",
                            "else", "max", "in"])

    @st.composite
    def literal(draw):
        op = draw(name) + draw(st.sampled_from(["", "", ".up", ".at", ".x1"])) + draw(st.sampled_from(["", "", "[1]"]))
        args = f"({draw(space)}{draw(st.sampled_from(['0', '1', '12', '007']))}{draw(space)},{draw(space)}" \
               f"{draw(st.sampled_from(['0', '3']))}{draw(space)})"
        if draw(st.integers(0, 6)) == 0:
            args = draw(st.sampled_from(["", "(0)", "(k, 1)", "(0, 1, 2)", "(0+1, 2)"]))
        return op + draw(st.sampled_from(["", "", " "])) + args

    suffix = st.sampled_from(["", "", "", "?", "* 2", "*k", "at 3", "at(1)", "if k > 0", "? at 2", "* 2 if k"])

    def item(inner):
        return st.one_of(
            st.tuples(literal(), space, suffix).map("".join),
            st.tuples(literal(), space, literal()).map(lambda t: t[0] + t[1] + "&" + t[1] + t[2]),
            st.lists(literal(), min_size=2, max_size=3).map(lambda ops: "(" + " | ".join(ops) + ")"),
            st.tuples(inner, suffix).map(lambda t: "(" + t[0] + ")" + t[1]),
            inner.map(lambda body: "for k in 0 .. 2 {" + body + "}"),
            st.tuples(inner, inner).map(lambda t: "if k > 0 {" + t[0] + "} else {" + t[1] + "}"),
            st.sampled_from(["let k = 1", ";", "F", "B.up"]))
    return st.recursive(st.just(""), lambda inner: st.lists(st.tuples(item(inner), space), max_size=6).map(
        lambda items: "".join(unit + (gap or " ") for unit, gap in items)), max_leaves=12)


@pytest.mark.slow
def test_literal_runs_parse_as_the_general_rule_on_generated_programs():
    """The one-token run against the grammar without it, on generated program bodies: the same AST and
    spans, or both refuse."""
    from hypothesis import HealthCheck, given, settings
    general = _general_parser()

    def read(text, parse):
        try:
            return parse(text)
        except Exception:  # noqa: BLE001 (either parser's refusal, compared as such)
            return "refused"

    @settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_program_bodies())
    def same(body):
        text = f'schedule x "x"\non device 0 {{ {body} }}\n'
        fast = read(text, lambda t: parse_source(Source("t.sched", t)))
        assert fast == read(text, lambda t: ToAst().transform(general.parse(t))), body
    same()


def test_what_was_expected_is_listed_up_to_the_one_cap():
    """The expected tokens are a text.listed list: all 20 of a bad top-level line (at the cap of 20;
    past it, `... and N more`, as test_text shows)."""
    message = _error('schedule x "x"\nfrobnicate 3\n').render().splitlines()[0]
    assert message.endswith("'queue', 'recompute', 'replicate', 'require', 'squeeze', 'task', 'use'") \
        and "'offload'" in message and "more" not in message
