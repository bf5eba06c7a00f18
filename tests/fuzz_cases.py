"""Generated hostile inputs for the whole command line, shared by tests/test_fuzz_cli.py (a few hundred
cases in process) and benchmarks/fuzz_cli.py (tens of thousands, each in its own process).

A case is a category, an argv for `schedc` and the files it needs. Paths in argv and file contents
name the case's directory as `{d}`. `classify` turns what a run printed and returned into one outcome:
ok (exit 0), failed (1), usage (2), or a defect: traceback, timeout, memory, bad-exit (outside {0, 1,
2} or a signal), unlocated (an error about a .sched or .csv input without line:column), silent (a
non-zero exit with no error line), nonfinite (exit 0 printing inf or nan), invalid-stats (the stats of a
schedule that failed its checks printed as if real), flood (over 1 MiB of output; told by the runner).

Every generator is seeded: `cases(seed, n)` gives the same cases on every machine.
"""
from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = {p.stem: p.read_text() for p in sorted((ROOT / "schedc" / "schedules").glob("*.sched"))}
FIXTURES = {p.name: p.read_text() for p in sorted((ROOT / "tests" / "fixtures").rglob("*.sched"))}

DEFECTS = ("traceback", "timeout", "memory", "bad-exit", "unlocated", "silent", "nonfinite", "invalid-stats",
           "flood", "data-loss", "late-refusal")
OUTCOMES = ("ok", "failed", "usage") + DEFECTS


@dataclass
class Case:
    category: str
    argv: list[str]
    files: dict[str, bytes] = field(default_factory=dict)
    inputs: tuple[str, ...] = ()      # files (names in `files`) whose errors must be located
    slow: bool = False                # starts torchrun or Graphviz on something big: benchmark only
    kept: tuple[str, ...] = ()        # files (names in `files`) the case must leave as they were
    fails_late: bool = False          # a --fault-* run: its ranks fail after torchrun starts, by design

    def resolved(self, directory: str) -> list[str]:
        return [a.replace("{d}", directory) for a in self.argv]

    def describe(self) -> str:
        return " ".join(self.argv)


# Numbers a hostile user types -------------------------------------------------------------------

INT_EXTREMES = ["0", "-1", "1", "2", "3", "7", "64", "65", "1000", "100000", "1000000", "10000000",
                "1000000000", "2147483648", "9223372036854775808", "99999999999999999999999999999",
                "1" + "0" * 400]
FLOAT_EXTREMES = ["0.5", "-0.5", "1.5", "1e308", "1e309", "1e999", "-1e308", "1e-320", "4.9e-324",
                  "1.0", "2.0", "0.0", "-0.0", "nan", "NaN", "inf", "-inf", "Infinity", "1e3", "3e0"]
JUNK_NUMBERS = ["", "abc", "0x10", "1_000", "１", "1e", "--1", "+4", " 4 ", "4.", ".5", "True", "None",
                "p", "m", "2**10", "1/0", "\x00", "4;5", "١"]
ALL_NUMBERS = INT_EXTREMES + FLOAT_EXTREMES + JUNK_NUMBERS

# Source tokens ---------------------------------------------------------------------------------

TOKEN = re.compile(r'\s+|#[^\n]*|"(?:[^"\\\n]|\\.)*"|\d+\.\d+(?:[eE][-+]?\d+)?|\d+(?:[eE][-+]?\d+)?'
                   r'|[A-Za-z_]\w*|\.\.|->|//|\*\*|<=|>=|==|!=|.', re.S)
KEYWORDS = ["schedule", "param", "require", "devices", "pipeline", "stages", "device", "microbatches",
            "replicate", "cost", "memory", "limit", "backward", "split", "queue", "by", "on", "let", "for",
            "in", "if", "else", "greedy", "inflight", "task", "after", "keeps", "at", "end", "fill",
            "bubbles", "with", "and", "or", "not", "min", "max", "ceil", "floor", "abs", "F", "B", "I",
            "W", "s", "i", "d", "c", "p", "m", "v", "k", "w", "h", "X", "Y", "up", "down", "main"]
PUNCT = ["(", ")", "{", "}", ",", ";", ".", "..", "->", "=", "*", "**", "/", "//", "%", "+", "-", "<",
         "<=", "==", "!=", ">", '"x"', '"', "#", "\n", "\\", "$", "é", "\t", "0.", "1e", "9" * 30]

# Statements and expressions inserted into library files: each a plausible way to break one rule.
SNIPPETS = [
    "devices {N}", "param z = {N}", "require {N} > 0 \"z\"", "let q = {N}", "let q = (-{N}) ** 0.5",
    "let q = (0 - 2) ** 0.5", "let q = {N} ** {N}", "let q = 10 ** 64 * 10 ** 64", "let q = 1 / 0",
    "let q = 1e308 * 10", "let q = -(1e308 * 10) + 1e308 * 10", "let q = {N} // 0", "let q = {N} % 0",
    "for k2 in 0 .. {N} {{ }}", "for k2 in 0 .. {N} {{ let z = k2 }}", "for k2 in -{N} .. {N} {{ }}",
    "for k2 in 0 .. {N} {{ for k3 in 0 .. {N} {{ }} }}", "F * {N}", "B * {N}", "(F B) * {N}",
    "F * (-{N})", "F * 0.5", "F * (1e308 * 10)", "F(0, {N})", "F({N}, 0)", "F(-1, 0)", "B.up",
    "cost F = {N}", "cost F = -{N}", "cost F = 1e308 * 10", "cost B(s) = 1 / (s - 1)", "cost F = (0-1) ** 0.5",
    "memory F = {N}", "memory F = -1", "limit memory <= {N}", "limit memory <= 1e308 * 10",
    "limit memory <= (0-1) ** 0.5", "queue F by ({N} // i)", "queue F by (i ** {N})", "queue B by ((0-i) ** 0.5)",
    "greedy inflight <= {N}", "task t(s, i) = {N} after F(s, i)", "task t(s) = 1 after B(s, *) split {N}",
    "task t(s, i) = -1 after F(s, i)", "fill bubbles with t split {N}", "backward split",
    "pipeline extra {{ stages {N}; device s -> s; microbatches {N} }}",
    "pipeline extra {{ stages 2; device s -> s * {N}; microbatches 0 .. {N} }}",
    "replicate main, main", "on device {N} {{ F }}", "on device d {{ F * {N} }}",
    "let q = min()", "let q = abs(1, 2)", "let q = ceil(1e308 * 10)", "let q = floor((0-1) ** 0.5)",
]


def _tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def _extreme(rng: random.Random) -> str:
    return rng.choice(INT_EXTREMES + FLOAT_EXTREMES[:12])


def _deep(rng: random.Random, depth: int) -> str:
    kind = rng.random()
    if kind < 0.4:
        return "(" * depth + "1" + ")" * depth
    if kind < 0.6:
        return "-" * depth + "1"
    if kind < 0.8:
        return "1" + " + 1" * depth
    return "not " * depth + "1"


def mutate_sched(rng: random.Random, text: str) -> str:
    """One to four grammar-aware edits: number tokens replaced by extremes, names by other names or
    keywords, tokens dropped, doubled, swapped or inserted, snippets inserted at statement borders,
    deep nesting, and torn endings."""
    toks = _tokens(text)
    for _ in range(rng.randint(1, 4)):
        if not toks:
            toks = [""]
        k = rng.randrange(len(toks))
        choice = rng.random()
        if choice < 0.25:
            numbers = [j for j, t in enumerate(toks) if t[:1].isdigit()]
            if numbers:
                toks[rng.choice(numbers)] = rng.choice(ALL_NUMBERS[:37] + ["(0-1)", "(1/0)", "0.5"])
        elif choice < 0.35:
            names = [j for j, t in enumerate(toks) if t[:1].isalpha()]
            if names:
                toks[rng.choice(names)] = rng.choice(KEYWORDS)
        elif choice < 0.43:
            del toks[k]
        elif choice < 0.48:
            toks.insert(k, toks[k])
        elif choice < 0.53 and k + 2 < len(toks):
            toks[k], toks[k + 2] = toks[k + 2], toks[k]
        elif choice < 0.61:
            toks.insert(k, " " + rng.choice(KEYWORDS + PUNCT) + " ")
        elif choice < 0.86:
            snippet = rng.choice(SNIPPETS).replace("{N}", _extreme(rng)).replace("{{", "{").replace("}}", "}")
            borders = [j for j, t in enumerate(toks) if "\n" in t or t in ("{", ";")] or [len(toks) - 1]
            toks.insert(rng.choice(borders) + 1, f"\n{snippet}\n")
        elif choice < 0.93:
            numbers = [j for j, t in enumerate(toks) if t[:1].isdigit()] or [k]
            toks[rng.choice(numbers)] = _deep(rng, rng.choice([10, 150, 199, 201, 400, 1000, 5000, 50000]))
        else:
            cut = rng.randrange(len("".join(toks)) + 1)
            return "".join(toks)[:cut]
    return "".join(toks)


# Command lines --------------------------------------------------------------------------------

def _compiler_command(rng: random.Random, target: str, allow_slow: bool) -> tuple[list[str], bool]:
    """A subcommand that reads a schedule, with plausible options: (argv, slow)."""
    kind = rng.choices(["check", "simulate", "compile", "render", "export"], [5, 4, 2, 2, 1])[0]
    if kind == "check":
        return ["check", target], False
    if kind == "simulate":
        extra = rng.choice([[], ["--json"], ["--latency", rng.choice(["0.5", "1", "0"])]])
        return ["simulate", target, *extra], False
    if kind == "compile":
        return ["compile", target, "-o", "{d}/out"], False
    if kind == "export":
        return ["export", target, "-o", "{d}/out.csv"], False
    ext = rng.choice([".dot", ".json", ".dot", ".svg", ".html"] if allow_slow else [".dot", ".json"])
    dag = ["--dag"] if ext in (".dot", ".svg") and rng.random() < 0.3 else []
    return ["render", target, "-o", "{d}/out" + ext, *dag], ext in (".svg", ".html")


def sched_case(rng: random.Random, allow_slow: bool = True) -> Case:
    name, text = rng.choice(list(LIBRARY.items()) + list(FIXTURES.items()) * (rng.random() < 0.2))
    name = Path(name).stem
    data = mutate_sched(rng, text).encode("utf-8", "surrogatepass")
    if rng.random() < 0.03:
        data = data[: rng.randrange(len(data) + 1)] + bytes([rng.choice([0, 0xff, 0xc3, 0x80])]) + data[1:]
    argv, slow = _compiler_command(rng, "{d}/" + name + ".sched", allow_slow)
    return Case("sched", argv, {name + ".sched": data}, (name + ".sched",), slow)


def _params(text: str) -> list[str]:
    return re.findall(r"^param (\w+)", text, re.M)


def define_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """-D with numeric extremes (and junk) for the params of every library schedule."""
    name, text = rng.choice(list(LIBRARY.items()))
    params = (_params(text) or ["p", "m"]) + ["nope"] * (rng.random() < 0.05)  # a composed file's come from its base
    defines = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        param = rng.choice(params)
        value = rng.choice(ALL_NUMBERS)
        form = rng.random()
        defines += ["-D", f"{param}={value}" if form < 0.9 else rng.choice([param, f"={value}", f"{param} = {value}"])]
    argv, slow = _compiler_command(rng, name, allow_slow and rng.random() < 0.2)
    return Case("define", argv[:2] + defines + argv[2:], {}, (), slow)


# torch CSV schedules ---------------------------------------------------------------------------

def _export_rows(p: int, m: int, kind: str) -> list[list[str]]:
    """Valid torch CSV rows written here by hand (GPipe or 1F1B), the start of most CSV mutations."""
    rows = []
    for d in range(p):
        if kind == "gpipe":
            rows.append([f"{d}F{i}" for i in range(m)] + [f"{d}B{i}" for i in range(m)])
            continue
        w, row, f, b = min(p - 1 - d, m), [], 0, 0
        row += [f"{d}F{j}" for j in range(w)]
        f = w
        while f < m:
            row += [f"{d}F{f}", f"{d}B{b}"]
            f, b = f + 1, b + 1
        row += [f"{d}B{j}" for j in range(b, m)]
        rows.append(row)
    return rows


CELL_JUNK = ["", " ", "0F", "F0", "0X0", "-1F0", "0F-1", "0f0", "0F0.5", "0F99999999", "99999999F0",
             "0F" + "9" * 400, "9" * 400 + "B0", "0SEND_F1", "1RECV_B0", "0REDUCE_GRAD", "UNSHARD", "2RESHARD3",
             "(0F0;0B0)OVERLAP_F_B", "((0F0;0B0)OVERLAP_F_B;0F1)OVERLAP_F_B", "()OVERLAP_F_B", "(0F0",
             '"0F0"', '"0F0', '"0F0,0B0"', '"a""b"', "0I0", "0W0", "\t0F0", "0F0\r", "é", "\x00", "0F0;0B0"]


def csv_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Malformed torch CSVs of every shape: edited valid schedules, junk cells, huge numbers, long rows,
    many ranks, quoting, overlap nesting, blank lines, bad bytes."""
    p, m = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 4, 8])
    rows = _export_rows(p, m, rng.choice(["gpipe", "1f1b"]))
    shape = rng.random()
    if shape < 0.5:
        for _ in range(rng.randint(1, 5)):
            r = rng.randrange(len(rows))
            row = rows[r]
            edit = rng.random()
            k = rng.randrange(len(row) + 1)
            if edit < 0.35:
                row.insert(k, rng.choice(CELL_JUNK))
            elif edit < 0.5 and row:
                del row[min(k, len(row) - 1)]
            elif edit < 0.65 and row:
                row.insert(k, rng.choice(row))
            elif edit < 0.8 and row:
                cell = row[min(k, len(row) - 1)]
                row[min(k, len(row) - 1)] = re.sub(r"\d+", lambda _: rng.choice(INT_EXTREMES[:14]), cell, count=1)
            else:
                rows.insert(rng.randrange(len(rows) + 1), [])
    elif shape < 0.62:
        cell = rng.choice(["0F0", "0F99999999", "1B3", "", "0F0", "(0F0;0F1)OVERLAP_F_B"])
        rows = [[cell] * rng.choice([1000, 10000, 100000 if allow_slow else 20000])]
    elif shape < 0.72:
        count = rng.choice([100, 1000, 5000] if allow_slow else [50, 300])
        rows = [[f"{r}F0", f"{r}B0"] for r in range(count)]
    elif shape < 0.8:
        big = rng.choice(["99999999", "100000", "9999999999999", "1" + "0" * 30])
        rows = [[f"{big}F0", "0F0", "0B0"], [f"0F{big}", f"0B{big}"], [f"{big}F{big}"]][:rng.randint(1, 3)]
    elif shape < 0.88:
        depth = rng.choice([10, 100, 1000, 20000])
        rows = [["(" * depth + "0F0" + ")OVERLAP_F_B" * depth]]
    else:
        rows = [[rng.choice(CELL_JUNK) for _ in range(rng.randint(0, 6))] for _ in range(rng.randint(0, 5))]
    sep = rng.choice([",", ",", ",", ";", ", ", "\t"])
    eol = rng.choice(["\n", "\n", "\r\n", "\r"])
    text = eol.join(sep.join(row) for row in rows) + rng.choice([eol, ""])
    data = text.encode("utf-8", "surrogatepass")
    if rng.random() < 0.05:
        data = rng.choice([b"\xef\xbb\xbf", b"\xff\xfe", b""]) + data + rng.choice([b"\xff", b"\x00", b""])
    argv, slow = _compiler_command(rng, "{d}/sched.csv", allow_slow and rng.random() < 0.2)
    if rng.random() < 0.15:
        argv[2:2] = ["-D", f"m={rng.choice(ALL_NUMBERS)}"]
    return Case("csv", argv, {"sched.csv": data}, ("sched.csv",), slow)


# Plans -----------------------------------------------------------------------------------------

def plan_hash(obj: dict, nest: str = "") -> str:
    """The content hash of docs/plan-format.md (SHA-256 of the compact, key-sorted JSON of everything
    but format, version and hash), recomputed as a careless tool would after an edit; `nest` is the
    text that stands in for _NEST."""
    body = {k: v for k, v in obj.items() if k not in ("format", "version", "hash")}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.replace(json.dumps(_NEST), nest, 1).encode()).hexdigest()


PLAN_VALUES = [0, -1, 1, 2, 3, 99, 10 ** 9, 2 ** 64, 1.5, None, "x", "1", [], {}, True, [0, 0], [[[]]],
               [1] * 5, -(2 ** 63)]


def _paths(obj, prefix=()):
    """Every (path, value) in a JSON tree, skipping the big per-instruction lists' bulk."""
    yield prefix, obj
    if len(prefix) > 12:
        return
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        picks = range(len(obj)) if len(obj) <= 6 else sorted({0, 1, len(obj) // 2, len(obj) - 1})
        for index in picks:
            yield from _paths(obj[index], prefix + (index,))


def _set(obj, path, value):
    for key in path[:-1]:
        obj = obj[key]
    if value is _DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value


_DELETE = object()
_NEST = "\u0000nest\u0000"  # stands for a deep nest of lists, spliced into the text (json.dumps would recurse)


def mutate_plan(rng: random.Random, plan: dict) -> bytes:
    obj, depth = json.loads(json.dumps(plan)), 0
    for _ in range(rng.randint(1, 3)):
        try:
            paths = [p for p, _ in _paths(obj) if p and p[0] not in ("format", "version", "hash")]
            path = rng.choice(paths)
            edit = rng.random()
            parent = obj
            for key in path[:-1]:
                parent = parent[key]
            if edit < 0.55:
                _set(obj, path, copy.deepcopy(rng.choice(PLAN_VALUES)))  # a shared [] set twice could nest in itself
            elif edit < 0.65:
                _set(obj, path, _DELETE)
            elif edit < 0.75 and isinstance(parent, list):
                parent.insert(path[-1], json.loads(json.dumps(parent[path[-1]])))
            elif edit < 0.82:
                steps = [s for r in obj.get("ranks", []) if isinstance(r, dict) for s in r.get("steps", [])
                         if isinstance(s, list)]
                if steps:
                    step = rng.choice(steps)
                    kept = [i for i in step if not (isinstance(i, dict) and i.get("op") == "STEP")]
                    step[:] = kept if rng.random() < 0.5 else kept + [{"op": "STEP", "stage": None, "mb": None}] * 2
            elif edit < 0.9:
                _set(obj, path, _NEST)
                depth = rng.choice([50, 500, 5000, 100000])
            else:
                if isinstance(obj.get("ranks"), list) and obj["ranks"]:
                    rng.shuffle(obj["ranks"])
                    if rng.random() < 0.5:
                        obj["ranks"].pop()
        except (TypeError, KeyError, IndexError, AttributeError):
            continue  # an earlier edit changed the shape this one expected
    if rng.random() < 0.15:
        _edit_fields(rng, obj)
    nest = "[" * depth + "0" + "]" * depth
    if rng.random() < 0.85:
        obj["hash"] = plan_hash(obj, nest)
    text = json.dumps(obj).replace(json.dumps(_NEST), nest, 1)
    if rng.random() < 0.05:
        text = text[: rng.randrange(len(text))]
    if rng.random() < 0.03:
        text = text.replace("0", "NaN", 1)
    return text.encode()


def _edit_fields(rng: random.Random, obj: dict) -> None:
    """The fields the runtime and the checks read, edited as a user would: chunks of 0, "2", 3 or
    1e400 (read as infinity), an O without its L (or the reverse), a placed R dropped, microbatches
    that disagree with the pipelines'."""
    edit = rng.random()
    if edit < 0.4:
        obj["chunks"] = rng.choice([0, "2", 3, -1, 1.5, 2, 4, 10 ** 6, None, float("inf")])
    elif edit < 0.75:
        gone = rng.choice(["L", "O", "R", "F", "B", "SEND_F", "RECV_B"])
        ranks = obj.get("ranks") if isinstance(obj.get("ranks"), list) else []
        for rank in (r for r in ranks if isinstance(r, dict) and rng.random() < 0.7):
            steps = rank.get("steps") if isinstance(rank.get("steps"), list) else []
            for step in (s for s in steps if isinstance(s, list)):
                step[:] = [i for i in step if not (isinstance(i, dict) and i.get("op") == gone)]
    else:
        obj[rng.choice(["microbatches", "devices", "stages"])] = rng.choice([0, 1, 3, 8, -1, "2", 2 ** 64])


def plan_case(rng: random.Random, plans: dict[str, dict], allow_slow: bool = True) -> Case:
    """An edited plan for render (always) or run (the one-process reference, or a few real launches)."""
    name = rng.choice(sorted(plans))
    data = mutate_plan(rng, plans[name])
    command = rng.random()
    if command < 0.6 or not allow_slow:
        ext = rng.choice([".dot", ".json", ".dot", ".svg"] if allow_slow else [".dot", ".json"])
        argv = ["render", "{d}/plan.json", "-o", "{d}/out" + ext]
        return Case("plan-render", argv, {"plan.json": data}, (), ext == ".svg")
    if command < 0.93:
        return Case("plan-run", ["run", "{d}/plan.json", "--reference", *TINY_RUN], {"plan.json": data}, (), True)
    return Case("plan-launch", ["run", "{d}/plan.json", *TINY_RUN], {"plan.json": data}, (), True)


# What a `run` case trains: one step of a tiny model (4 layers: at least one per stage of every plan it
# runs). The fuzzer looks for plans and options the command line fails to check, not for how long a
# legitimate model trains: the option under test comes after these (the last one given wins), and a
# valid --steps count is held to RUN_STEPS.
TINY_RUN = ["--steps", "1", "--layers", "4", "--hidden", "8", "--heads", "1", "--seq", "8", "--mb-size", "1",
            "--vocab", "256", "--threads", "1", "--quiet", "--timeout", "15"]
RUN_STEPS = 2


def _run_steps(value: str) -> str:
    """A --steps value as typed, unless it is a valid count above RUN_STEPS (then RUN_STEPS)."""
    try:
        return str(RUN_STEPS) if int(value) > RUN_STEPS else value
    except ValueError:
        return value


# a valid size above these trains for long (1,000 layers: 29 s of CPU), which says nothing of the checks:
# held to them, as --steps is to RUN_STEPS; values past the runtime's limits stay as drawn
RUN_SIZES = {"--layers": (16, 4096), "--hidden": (64, 65536), "--seq": (64, 65536), "--vocab": (4096, 2 ** 24)}


def _run_value(option: str, value: str) -> str:
    """A runtime option's value as drawn, a valid --steps or size held to what trains in seconds."""
    if option == "--steps":
        return _run_steps(value)
    if option in RUN_SIZES:
        held, limit = RUN_SIZES[option]
        try:
            return str(held) if held < int(value) <= limit else value
        except ValueError:
            return value
    return value


FULL = b"@full"  # written as a device that is always full (like /dev/full), where the runner may make one

# Bad options -----------------------------------------------------------------------------------

COST_FILES = ['{"F": 1, "B": 2}', '{"F": -1}', '{"F": 1e999}', '{"F": NaN}', '{"F": Infinity}', '{"F": [1]}',
              '{"F": [1, 2, 3, 4, 5, 6, 7, 8, 9]}', '{"F": "x"}', '{"F": true}', '[1, 2]', '{', '',
              '{"F": 1e308, "B": 1e308}', '{"memory": {"B": -1}}', '{"memory": {"B": 1e999}}',
              '{"memory": []}', '{"F": 0, "B": 0}', '{"nope": 1}', '{"F": [1e-320, 1e-320, 1e-320, 1e-320]}',
              '{"F": 1, "B": 1e308, "memory": {"B": 1e308}}']
PROFILES = ["bs,time_f,time_b\n1,1,2\n", "bs,time_f,time_b\n1,-1,2\n", "bs,time_f,time_b\n1,nan,2\n",
            "bs,time_f,time_b\n1e999,1,2\n", "bs\n1\n", "", "bs,time_f,time_b\nx,1,2\n",
            "bs,time_f,time_b,mem_act,mem_save_err\n1,1,2,0,5\n", "bs,time_f,time_b\n1,1e308,1e308\n",
            "bs,time_f,time_b\n99999999999999999999999,1,2\n", "bs,time_f,time_b\n1,1,2\n1,3,4\n", "\xff"]
MODELS = ["layers = 4\nhidden = 64\n", "layers = -1\n", "layers = 1e999\n", "[model\n", "layers = 'x'\n",
          "hidden = 99999999999999999999\n", "", "layers = 0\nhidden = 0\n", "layers = nan\n"]
LIMITS = ["80GiB", "1", "0", "-1", "-1GiB", "1e999GiB", "nan", "inf", "abc", "1.5TB", "GiB", "", "9" * 400,
          "1e308GiB", "0.5B"]
TRACES = ['{"traceEvents": []}', '[]', '{', '{"traceEvents": [{"ph": "X", "ts": 1e999, "dur": -1, "name": "F"}]}',
          '{"traceEvents": [{"ph": "X", "ts": 0, "dur": 1, "name": "F", "args": {"stage": 99, "mb": -1}, "pid": 0}]}',
          '{"traceEvents": [{"ph": "X", "ts": "x"}]}', '{"traceEvents": [{"ph": "X", "ts": NaN, "dur": 1, "name": "F", "pid": 0}]}']
OUT_PATHS = ["{d}/missing/dir/x", "{d}/file.txt/x", "{d}/full", "/proc/nope/x", "{d}", "", "{d}/a\x01b",
             "{d}/out"]


def option_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Bad options to every subcommand: latencies, output paths, costs files, profiles, model files,
    memory limits, measured traces, the runtime's numbers, unknown commands and flags."""
    name = rng.choice(sorted(LIBRARY))
    files: dict[str, bytes] = {"file.txt": b"x", "full": FULL}
    kind = rng.random()
    if kind < 0.15:
        argv = [rng.choice(["simulate", "compile", "render"]), name, "--latency", rng.choice(ALL_NUMBERS)]
        if argv[0] == "render":
            argv += ["-o", "{d}/x.dot"]
        elif argv[0] == "compile":
            argv += ["-o", "{d}/out"]
    elif kind < 0.35:
        command = rng.choice(["compile", "render", "export", "render", "export"])
        out = rng.choice(OUT_PATHS)
        if command == "render":
            out += rng.choice([".dot", ".json", ".svg", ".html", ".txt", ""])
        elif command == "export":
            out += rng.choice([".csv", ""])
        argv = [command, rng.choice(["1f1b", "gpipe", "chimera"]), "-o", out]
    elif kind < 0.5:
        files["costs.json"] = rng.choice(COST_FILES).encode()
        argv = [rng.choice(["check", "simulate", "compile"]), rng.choice(["1f1b", "pipefisher", "gpipe"]),
                "--costs", "{d}/costs.json"]
        if argv[0] == "compile":
            argv += ["-o", "{d}/out"]
    elif kind < 0.6:
        files["profile.csv"] = rng.choice(PROFILES).encode()
        argv = [rng.choice(["check", "simulate"]), rng.choice(["pipefisher", "1f1b"]), "--profile",
                "{d}/profile.csv", "--microbatch-size", rng.choice(["1", "0", "-1", "x", "1" + "0" * 30])]
    elif kind < 0.7:
        files["model.toml"] = rng.choice(MODELS).encode()
        argv = ["check", name, "--model", "{d}/model.toml", "--memory-limit", rng.choice(LIMITS)]
    elif kind < 0.75:
        files["trace.json"] = rng.choice(TRACES).encode()
        argv = ["render", "1f1b", "-D", "p=2", "-D", "m=2", "--measured", "{d}/trace.json", "-o", "{d}/x.dot"]
    elif kind < 0.93:
        option = rng.choice(["--nproc", "--steps", "--timeout", "--dp", "--every", "--lr", "--warmup",
                             "--layers", "--hidden", "--heads", "--seq", "--mb-size", "--vocab", "--threads",
                             "--save", "--resume", "--fault-kill", "--model", "--bogus", "--seed"])
        value = (rng.choice(["{d}/missing", "{d}/file.txt", "/proc/x", "{d}/full"])
                 if option in ("--save", "--resume", "--model") else rng.choice(ALL_NUMBERS))
        files["plan.json"] = b"@plan"  # replaced by a small valid plan when the case is written
        argv = ["run", "{d}/plan.json", *TINY_RUN, option, _run_value(option, value)]
    else:
        argv = rng.choice([["nope"], ["check"], ["check", "--bogus", name], ["export", name, "--format", "x", "-o", "x"],
                           ["check", "{d}/missing.sched"], ["check", "{d}/file.txt"], ["check", "{d}"],
                           ["render", name, "-o", "{d}/x.dot", "--microbatch-size", "4"],
                           ["check", name, "--costs", "{d}/file.txt", "--profile", "{d}/file.txt"],
                           ["run"], ["run", "{d}/missing.json"], ["run", "{d}/file.txt"], ["list", "x"],
                           ["check", "/dev/null"], ["check", "/dev/zero.sched"], ["demo", "--steps", "0"]])
    return Case("options", argv, files, (), False)


GPT = (ROOT / "schedc" / "models" / "gpt-1.7b.toml").read_text()
CLUSTER_TOML = (ROOT / "schedc" / "clusters" / "dgx-a100-80gb.toml").read_text()
SIZES = ["1", "2", "4", "8", "16", "32", "64", "3", "6", "12", "8", "16", "0"]  # mostly searchable


def _mangled_toml(rng: random.Random, text: str) -> str:
    """A model or cluster TOML with one value replaced by a hostile number or one line cut."""
    lines = text.splitlines()
    numbered = [i for i, line in enumerate(lines) if re.match(r"^\w+\s*=\s*[0-9.]", line)]
    i = rng.choice(numbered)
    if rng.random() < 0.8:
        key = lines[i].split("=")[0]
        lines[i] = f"{key}= {rng.choice(ALL_NUMBERS + LIMITS)}"
    else:
        del lines[i]
    return "\n".join(lines) + "\n"


COMPILED_WHOLE = ("pipefisher", "pipefisher_1f1b")  # a fill searched for every candidate: minutes, not seconds


def tune_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """`schedc tune`: the configuration search with hostile sizes, limits, lists, model and cluster
    files and schedules (a mutated one among them), and --synthesize with hostile -D, costs, limits and
    latencies; each mode given the other's options now and then."""
    files: dict[str, bytes] = {"file.txt": b"x", "full": FULL}
    number = (lambda: rng.choice(SIZES)) if rng.random() < 0.8 else (lambda: rng.choice(ALL_NUMBERS))
    slow = False
    if rng.random() < 0.65:
        model = "{d}/model.toml"
        cluster = rng.choice(["dgx-a100-80gb", "dgx-h100-80gb", "{d}/cluster.toml", "{d}/cluster.toml", "nope"])
        files["model.toml"] = (_mangled_toml(rng, GPT) if rng.random() < 0.25 else GPT).encode()
        files["cluster.toml"] = (_mangled_toml(rng, CLUSTER_TOML) if rng.random() < 0.5 else CLUSTER_TOML).encode()
        gpus = number()
        if not allow_slow and gpus.isdigit() and int(gpus) > 16:
            gpus = "16"  # the in-process run keeps searches short
        argv = ["tune", "--model", model, "--cluster", cluster, "--gpus", gpus, "--global-batch", number()]
        name = rng.choice([n for n in sorted(LIBRARY) if allow_slow or n not in COMPILED_WHOLE])
        if rng.random() < 0.5:
            files["mine.sched"] = (mutate_sched(rng, LIBRARY[name]) if rng.random() < 0.5 else LIBRARY[name]).encode()
            argv += ["--schedules", rng.choice(["{d}/mine.sched", f"{name},{{d}}/mine.sched", "{d}/mine.sched",
                                                 f"{{d}}/mine.sched,{name}", "{d}/missing.sched", "{d}/file.txt",
                                                 "nope", ",", f"{name},{name}"])]
        else:
            argv += ["--schedules", rng.choice(["1f1b", "1f1b,zb_h1", "interleaved_1f1b", "gpipe,dualpipev", name])]
        slow = name in COMPILED_WHOLE
        for option, values in (("--memory-limit", LIMITS), ("--tp", ["1", "2,4", "0", "x", "", "1,,2", "64"]),
                               ("--pp", ["1", "2", "0", "-2", "3,5", "99999999999"]),
                               ("--recompute", ["full", "none,full", "some", ""]),
                               ("--top", ["1", "0", "5", "1000000000"]),
                               ("--per", ["t", "p", "v", "b", "schedule", "recompute", "x"]),
                               ("--walk-ops", ["0", "1", "300", "-1", "x", "1e400", "99999999999999999999999"])):
            if rng.random() < 0.12:
                argv += [option, rng.choice(values)]
        argv += [flag for flag in ("--json", "--exhaustive", "--sequence-parallel", "--overlap-grad-reduce",
                                   "--blocking-p2p") if rng.random() < 0.15]
        if rng.random() < 0.05:
            argv += rng.choice([["-D", "p=2"], ["--activation-limit", "4"], ["--cost", "F=1"], ["-o", "{d}/x"]])
    else:
        argv = ["tune", "--synthesize", "-D", f"p={number()}", "-D", f"m={number()}"]
        if rng.random() < 0.1:
            argv = [a for a in argv if not a.startswith("m=")][:-1]
        for _ in range(rng.choice([0, 1, 2, 3])):
            kind = rng.choice(["F", "B", "I", "W", "X", "", "F"])
            argv += ["--cost", f"{kind}={','.join(rng.choice(ALL_NUMBERS[:30]) for _ in range(rng.choice([1, 2, 4])))}"]
        if rng.random() < 0.2:
            files["costs.json"] = rng.choice(COST_FILES + ['{"F": [1, 2], "I": [1, 1], "W": [2, 1], "B": [3, 3]}',
                                                           '{"F": 1, "curvature": 2}']).encode()
            argv += ["--costs", "{d}/costs.json"]
        if rng.random() < 0.9:
            argv += ["--activation-limit", rng.choice(["1", "2", "4", "8", "2.5", "4,3", "0.5"] + ALL_NUMBERS)]
        if rng.random() < 0.3:
            argv += ["--latency", rng.choice(["0.5", "1", "0"] + FLOAT_EXTREMES)]
        if rng.random() < 0.4:
            argv += ["-o", rng.choice(OUT_PATHS + ["{d}/zb.sched", "-"])]
        if rng.random() < 0.2:
            argv.append("--json")
        if rng.random() < 0.05:
            argv += rng.choice([["--model", "{d}/file.txt"], ["--memory-limit", "4"], ["--top", "3"]])
    return Case("tune", argv, files, tuple(k for k in ("mine.sched",) if k in files), slow)


# The second round's surfaces: every input reader, expansions, calibrate, checkpoints ---------------

FIFO, ZERO, DIR = b"@fifo", b"@zero", b"@dir"  # a named pipe, a link to /dev/zero, a directory
_DEEP = "[" * 3000 + "]" * 3000
HUGE_INT = "9" * 5000
READERS = {  # what reads a file, and the command line that makes it read one named {f}
    "model": (".toml", ["simulate", "1f1b", "--cluster", "dgx-a100-80gb", "--model", "{f}"]),
    "cluster": (".toml", ["simulate", "1f1b", "--cluster", "{f}", "--model", "{d}/gpt.toml"]),
    "check-model": (".toml", ["check", "1f1b", "--model", "{f}", "--microbatch-size", "1"]),
    "costs": (".json", ["simulate", "1f1b", "--costs", "{f}"]),
    "profile": (".csv", ["simulate", "pipefisher", "--profile", "{f}", "--microbatch-size", "1"]),
    "trace": (".json", ["render", "1f1b", "-D", "p=2", "-D", "m=2", "--measured", "{f}", "-o", "{d}/x.dot"]),
    "plan": (".json", ["simulate", "{f}"]),
    "sched": (".sched", ["check", "{f}"]),
    "torch-csv": (".csv", ["simulate", "{f}"]),
    "calibrate-costs": (".json", ["calibrate", "-o", "{d}/c.toml", "--cluster", "dgx-a100-80gb", "--costs", "{f}",
                                  "--model", "{d}/small.toml", "--microbatch-size", "4"]),
    "tune-model": (".toml", ["tune", "--model", "{f}", "--cluster", "dgx-a100-80gb", "--gpus", "2",
                             "--global-batch", "8", "--schedules", "1f1b"]),
    "config": (".toml", ["run", "{d}/plan.json", "--model", "{f}", "--steps", "1"]),
}
SMALL_MODEL = 'layers = 4\nhidden = 256\nheads = 8\nseq = 128\nvocab = 256\nffn = 1024\ndtype = "fp32"\n'


def _hostile_content(rng: random.Random, suffix: str) -> tuple[bytes, bool]:
    """A file's content as a hostile user makes it, and whether its errors must be located."""
    kind = rng.choice(["fifo", "zero", "dir", "deep", "deep", "int", "int", "utf8", "key", "big"])
    if kind in ("fifo", "zero", "dir"):
        return {"fifo": FIFO, "zero": ZERO, "dir": DIR}[kind], False
    if kind == "big":
        return b" " * (17 * 2**20 if rng.random() < 0.1 else 4096), False
    if kind == "utf8":
        return b"layers = 4\n\xff\xfe = 1\n", False
    toml = suffix == ".toml"
    if kind == "deep":
        text = (f"layers = 4\nx = {_DEEP}\n" if toml else '{"F": 1,\n "B": ' + _DEEP + "}")
    elif kind == "int":
        text = (f"layers = 4\nhidden = {HUGE_INT}\n" if toml else '{"F": 1,\n "B": ' + HUGE_INT + "}")
    else:
        text = "layers = 4\nnope_" + "x" * rng.choice([1, 5000]) + " = 1\n" if toml else '{"nope": 1}'
    if suffix in (".csv", ".sched"):
        text = rng.choice(["bs,time_f,time_b\n" + HUGE_INT + ",1,2\n", "0F0," * 3 + HUGE_INT + "\n",
                           "(" * 3000 + ")" * 3000])
    return text.encode(), kind in ("deep", "int")


def input_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Every file the tool reads, given a FIFO, /dev/zero, a directory, a deep nest, an integer of
    thousands of digits, bad UTF-8, unknown keys or a file past the size cap."""
    reader = rng.choice(sorted(r for r in READERS if allow_slow or r != "config"))
    suffix, argv = READERS[reader]
    content, located = _hostile_content(rng, suffix)
    files = {f"in{suffix}": content, "gpt.toml": GPT.encode(), "small.toml": SMALL_MODEL.encode(),
             "plan.json": b"@plan"}
    argv = [a.replace("{f}", "{d}/in" + suffix) for a in argv]
    located = located and reader not in ("config", "profile")  # a profile's errors name its column instead
    return Case("inputs", argv, files, (f"in{suffix}",) if located else (), False)


BOUNDS = ["1000000000", "10 ** 9", "2 ** 62", "m * 1000000", "99999999999999"]
EXPANSIONS = [
    "  F? * {n}\n  B? * {n}",
    "  F * m\n  (B | F)? * {n}",
    "  (F B)? * {n}",
    "  for t in 0 .. {n} {{ F? }}\n  B * m",
    "  F * m\n  B at {n}\n  B * (m - 1)",
]


def expand_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Expansions a user can make huge: optional pops and alternatives with a bound of 10^9, squeeze
    slots at 10^9, a V-Half of 15,000 microbatches, renders of 512 to 4,096 devices, tune's searches."""
    kind = rng.random()
    if kind < 0.5:
        body = rng.choice(EXPANSIONS).format(n=rng.choice(BOUNDS))
        squeeze = "squeeze\n" if "at" in body or rng.random() < 0.3 else ""
        text = ('schedule x "x"\nparam p = 2\nparam m = 4\npipeline main { stages p; device s -> s; '
                f"microbatches m }}\n{squeeze}on device d {{\n{body}\n}}\n")
        return Case("expand", [rng.choice(["check", "simulate"]), "{d}/x.sched"], {"x.sched": text.encode()},
                    ("x.sched",), False)
    if kind < 0.65:
        m = rng.choice(["3000", "15000", "100000", "1000000"])
        return Case("expand", ["simulate", rng.choice(["v_half", "v_min", "zbv"]), "-D", "p=4", "-D", f"m={m}"])
    if kind < 0.9:
        p = rng.choice(["256", "512", "1024", "4096"])
        ext = rng.choice([".json", ".json", ".dot", ".html", ".svg"] + [".png"] * allow_slow)
        argv = ["render", rng.choice(["1f1b", "zb_h1", "gpipe"]), "-D", f"p={p}", "-o", "{d}/r" + ext]
        if rng.random() < 0.3:
            argv[5:5] = ["-D", f"m={rng.choice(['8', p, '480'])}"]
        return Case("expand", argv, {}, (), ext == ".png")
    schedules = rng.choice(["pipefisher", "pipefisher_1f1b"] if allow_slow else ["1f1b,zb_h1"])
    argv = ["tune", "--model", "{d}/gpt.toml", "--cluster", "dgx-a100-80gb", "--gpus", rng.choice(["8", "64", "1024"]),
            "--global-batch", rng.choice(["64", "512", "99999999999999999999999"]), "--schedules", schedules]
    return Case("expand", argv, {"gpt.toml": GPT.encode()}, (), False)


def calibrate_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """calibrate's option ranges (never a valid measuring run: that takes a minute) and profiles with no
    signal, a tiny one, a deep one, a wrong microbatch size, --cluster with nothing to fit."""
    files = {"small.toml": SMALL_MODEL.encode(), "profile.json": rng.choice([
        '{"F": [0, 0], "B": [0, 0]}', '{"F": [1e-12, 1e-12], "B": [1e-12, 1e-12]}', '{"F": [], "B": []}',
        '{"F": [50, 60], "B": [100, 120]}', '{"F": [50, 60], "B": [100, 0]}', '{"F": ' + _DEEP + "}",
        '{"F": [50], "B": [100, 120]}', '{"F": [1e308, 1e308], "B": [1e308, 1e308]}',
        '{"F": [50, 60], "B": [100, 120], "microbatch_size": ' + HUGE_INT + "}", '{"F": [-1, 1], "B": [1, 1]}']).encode()}
    if rng.random() < 0.4:
        option = rng.choice(["--ranks", "--threads", "--tp"])
        value = rng.choice(["0", "-1", "1", "x", "", "99999999999999999999", "1000000"])
        if option != "--ranks" and value not in ("0", "-1", "x", "", "99999999999999999999"):
            value = "0"  # a valid one would measure this machine for a minute
        if option == "--ranks" and value not in ("0", "-1", "1", "x", ""):
            value = rng.choice(["1", "0"]) if value != "1000000" else value
        return Case("calibrate", ["calibrate", "-o", "{d}/c.toml", option, value], files)
    argv = ["calibrate", "-o", rng.choice(["{d}/c.toml", "{d}/missing/c.toml", "-", "{d}"]), "--cluster",
            rng.choice(["dgx-a100-80gb", "nope", "{d}/small.toml"])]
    if rng.random() < 0.9:
        argv += ["--costs", "{d}/profile.json", "--model", "{d}/small.toml"]
    if rng.random() < 0.7:
        argv += ["--microbatch-size", rng.choice(["4", "1", "0", HUGE_INT[:30]])]
    return Case("calibrate", argv, files, (), False)


def checkpoint_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """--save over a checkpoint already there, --resume of a checkpoint of another run (another plan,
    model size, seed), or of a broken one; refused before torchrun unless --overwrite is given."""
    import hashlib
    import json
    files: dict[str, bytes] = {"plan.json": b"@plan"}
    checksums = {}
    for rank in (0, 1):
        data = f"rank {rank}".encode()
        files[f"ckpt/step-00000001/rank{rank}.pt"] = data
        checksums[f"rank{rank}.pt"] = hashlib.sha256(data).hexdigest()
    latest = {"dir": "step-00000001", "steps_done": rng.choice([1, 5, 10 ** 30]), "plan": "0" * 64, "world": 2,
              "dp": 1, "tp": 1, "seed": rng.choice([0, 7]), "distributed_optimizer": False,
              "model": {"code": "gpt", "layers": rng.choice([4, 8]), "hidden": 8, "heads": 1, "seq": 8, "vocab": 256},
              "files": checksums}
    files["ckpt/latest.json"] = rng.choice([json.dumps(latest), "{", "[]", '{"dir": 1}', '{"dir": "x", "files": {}}']).encode()
    mode = rng.choice(["--save", "--resume", "both"])
    extra = ["--save", "{d}/ckpt"] if mode == "--save" else ["--resume", "{d}/ckpt"]
    if mode == "both":
        extra = ["--resume", "{d}/ckpt", "--save", "{d}/ckpt2"]
        files["ckpt2/latest.json"] = b"{}"
    if rng.random() < 0.1:
        extra.append("--overwrite")
    return Case("checkpoint", ["run", "{d}/plan.json", *TINY_RUN, "--steps", str(RUN_STEPS), *extra], files, (), False)


# The third round's surfaces: output paths, resume, every runtime option, the torch API, model
# descriptions, calibrate's units and [overhead], the budgets ------------------------------------

CKPT = b"@ckpt"  # a real checkpoint of TINY_RUN on the small plan (one step), copied in where the runner has one
HF_CONFIGS = {p.parent.name: p.read_text() for p in sorted((ROOT / "tests" / "data").glob("hf*/*/config.json"))}
MODEL_TOMLS = {p.stem: p.read_text() for p in sorted((ROOT / "schedc" / "models").glob("*.toml"))}
RUN_OUTPUTS = ("--trace-out", "--report-out", "--profile-out", "--metrics-out", "--save-grads", "--save")
# paths a user gives an output: an input of the command, a directory, a FIFO, a missing folder, a file
# under a file, a device that is always full
BAD_OUTPUTS = ["{d}/plan.json", "{d}/dir", "{d}/fifo", "{d}/missing/x.json", "{d}/file.txt/x.json", "{d}/full",
               "{d}/mine.sched", "{d}/in.csv"]
OUTPUT_FILES = {"plan.json": b"@plan", "dir": DIR, "fifo": FIFO, "file.txt": b"x", "full": FULL,
                "mine.sched": LIBRARY["1f1b"].encode(), "in.csv": b"0F0,0B0\n"}


def output_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Data loss: an output path equal to an input of the same command, two outputs on one path, a
    directory, a FIFO, a missing folder or a full device as an output; a checkpoint directory holding the
    user's own files; --every past --steps. Every input and the user's files must stay as they were."""
    files = dict(OUTPUT_FILES)
    kind = rng.random()
    if kind < 0.3:  # the compiler writes a FIFO in place (docs: outputs.py), waiting for its reader: none here
        out = rng.choice([o for o in BAD_OUTPUTS if o != "{d}/fifo"])
        argv = rng.choice([["export", "{d}/mine.sched", "-o", out], ["render", "{d}/mine.sched", "-o", out],
                           ["render", "{d}/plan.json", "-o", out], ["compile", "{d}/mine.sched", "-o", out],
                           ["export", "{d}/in.csv", "-o", out], ["render", "{d}/in.csv", "-o", out],
                           ["tune", "--synthesize", "-D", "p=2", "-D", "m=4", "-o", out],
                           ["calibrate", "--cluster", "dgx-a100-80gb", "-o", out]])
        return Case("outputs", argv, files, (), False, _kept(argv))
    if kind < 0.55:  # the runtime's outputs, one or two of them, on bad paths or on one path
        first, second = rng.sample(RUN_OUTPUTS, 2)
        argv = ["run", "{d}/plan.json", *TINY_RUN, first, rng.choice(BAD_OUTPUTS)]
        if rng.random() < 0.6:
            argv += [second, rng.choice(BAD_OUTPUTS[:3] + ["{d}/o1", argv[-1]])]
        return Case("outputs", argv, files, (), False, _kept(argv))
    if kind < 0.8:  # --save into a directory of the user's own files (named like checkpoints, too)
        files.update({"ck/step-plots/a.txt": b"mine", "ck/notes.txt": b"mine", "ck/step-00000001/x.txt": b"mine"})
        argv = ["run", "{d}/plan.json", *TINY_RUN, "--save", "{d}/ck"]
        argv += [flag for flag in ("--overwrite",) if rng.random() < 0.3]
        if rng.random() < 0.3:
            argv += ["--resume", "{d}/ck"]
        return Case("outputs", argv, files, (), False, _kept(argv) + ("ck/step-plots/a.txt", "ck/notes.txt",
                                                                     "ck/step-00000001/x.txt"))
    every, steps = rng.choice(["5", "3", "0", "-1", "x", "2"]), rng.choice(["2", "1", "0"])
    argv = ["run", "{d}/plan.json", *TINY_RUN, "--save", "{d}/" + rng.choice(["new", "dir", "fifo", "file.txt", "full"]),
            "--every", every, "--steps", steps]
    return Case("outputs", argv, files, (), False, _kept(argv))


def _kept(argv: list[str]) -> tuple[str, ...]:
    """The user's files a command must leave as they were: its input (even when also named as an
    output: that is refused) and every file it is not told to write."""
    read = {argv[1]} if argv[0] in ("export", "render", "compile", "run") else set()
    return tuple(n for n in ("plan.json", "file.txt", "mine.sched", "in.csv")
                 if "{d}/" + n in read or "{d}/" + n not in argv)


# what a resume changes from the run that made the checkpoint (TINY_RUN, one step, 2 ranks)
RESUME_CHANGES = [["--dp", "2"], ["--tp", "2"], ["--optimizer", "sgd"], ["--zero", "1", "--dp", "2"],
                  ["--zero", "2", "--dp", "2"], ["--zero", "3", "--dp", "2"], ["--cp", "2"], ["--cp", "2", "--zero", "1"],
                  ["--distributed-optimizer", "--dp", "2"], ["--stage-layers", "1,3"], ["--seed", "7"],
                  ["--layers", "8"], ["--hidden", "16"], ["--account-for-embedding"], ["--steps", "1"],
                  ["--dtype", "bf16"], ["--recompute", "full"], ["--vocab", "512"], ["--model", "{d}/tiny.json"],
                  ["--heads", "2"], ["--seq", "16"], ["--no-reshard-after-forward"], ["--synthetic"]]


def resume_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """--resume of a real checkpoint under another layout, optimizer, ZeRO level, cp, split, model,
    seed or precision (refused before torchrun, naming the difference, unless it converts), now and
    then broken (a rank file gone or changed, latest.json edited), or unchanged (it resumes)."""
    files = {"plan.json": b"@plan", "ck": CKPT, "tiny.json": HF_CONFIGS["tiny-llama"].encode()}
    changes = [] if rng.random() < 0.05 else [w for c in rng.sample(RESUME_CHANGES, rng.choice([1, 1, 2])) for w in c]
    argv = ["run", "{d}/plan.json", *TINY_RUN, "--steps", "2", "--resume", "{d}/ck", *changes]
    if rng.random() < 0.3:
        argv += ["--save", rng.choice(["{d}/ck", "{d}/ck2"])]
    breakage = rng.random()
    if breakage < 0.1:
        files["ck/latest.json"] = rng.choice([b"{", b"[]", b'{"dir": "step-00000001"}', b'{"dir": "../..", "files": {}}'])
    elif breakage < 0.15:
        files["ck/step-00000001/rank1.pt"] = b"not a checkpoint"
    return Case("resume", argv, files, (), False)


# the runtime's options: (values it accepts, values it must refuse before any process starts)
RUN_OPTIONS = {
    "--zero": (["0", "1", "2", "3"], ["4", "-1", "x", "1.5", ""]), "--cp": (["1", "2"], ["0", "3", "-2", "x", "65536"]),
    "--ep": (["1", "2"], ["0", "x", "3"]), "--dtype": (["fp32", "bf16"], ["fp8", "fp16", "x", ""]),
    "--timeout": (["15", "60"], ["0", "0.01", "-1", "nan", "inf", "1e309", "x", "0.5"]),
    "--tp": (["1", "2"], ["0", "3", "x", "-1"]), "--dp": (["1", "2"], ["0", "-1", "x", "1e3", "300"]),
    "--recompute": (["full", "selective", "none"], ["some", ""]), "--optimizer": (["adamw", "sgd"], ["lion", ""]),
    "--lr": (["1e-3", "0.5"], ["nan", "inf", "-1", "0", "1e309"]), "--clip-grad": (["1.0"], ["0", "-1", "nan"]),
    "--lr-warmup-steps": (["1"], ["-1", "x"]), "--lr-decay-steps": (["2"], ["-1", "0", "x"]),
    "--stage-layers": (["2,2", "1,3"], ["4,0", "1,1", "a", "2,2,0", "-1,5", ""]),
    "--microbatch-size": (["1", "2"], ["0", "-1", "x"]), "--device": (["cpu"], ["cuda", "tpu"]),
    "--tf32": (["on", "off"], ["x"]), "--threads": (["1"], ["0", "-1", "100000"]),
    "--warmup": (["0", "1"], ["-1", "99", "x"]), "--vocab": (["256"], ["255", "0", "100000000000"]),
    "--seq": (["8", "16"], ["7", "0", "-8", "100000000"]), "--heads": (["1", "2"], ["0", "3", "-1"]),
    "--hidden": (["8", "16"], ["0", "7", "-8", "1000000"]), "--layers": (["4", "8"], ["0", "1", "-1", "5000"]),
    "--seed": (["0", "7"], ["-1", "x", "99999999999999999999999"]), "--nproc": (["2"], ["0", "-1", "3", "300"]),
    "--every": (["1"], ["0", "-1", "x"]), "--model-code": ([], ["nope.mod:fn", "os:sep", "x", "os"]),
    "--data": ([], ["nope.mod:fn", "os:sep", "x"]), "--loss": ([], ["nope.mod:fn", "json:nope", "x"]),
    "--tasks": ([], ["nope.mod", "x y"]), "--model": (["{d}/tiny.json"], ["{d}/file.txt", "nope", "{d}/dir", "gpt-175b"]),
    "--fault-kill": (["1:0"], ["2:0", "0:5", "x", "-1:0", "0"]), "--fault-hang": (["1:0"], ["9:0", "0:9"]),
    "--tolerance": (["0.1"], ["-1", "nan"]), "--save-grads": (["{d}/g"], ["{d}/file.txt", "{d}/dir"]),
}
RUN_FLAGS = ["--sequence-parallel", "--distributed-optimizer", "--reshard-after-forward", "--no-reshard-after-forward",
             "--no-scatter-gather", "--account-for-embedding", "--account-for-loss", "--synthetic", "--ignore-tasks",
             "--compare-to-reference", "--overwrite", "--bogus"]
CHUNKED = {"seq1f1b": "@plan-seq1f1b", "offload_1f1b": "@plan-offload_1f1b"}


def runopt_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Every runtime option, one to three at once, each a value the runtime accepts (now and then) or
    one it must refuse before torchrun; on the small 1F1B plan, a Seq1F1B plan or an offloading plan.
    Few draw only accepted values (those launch a tiny model), by the odds of the table."""
    plan = rng.choice(["@plan"] * 4 + sorted(CHUNKED.values()))
    files = {"plan.json": plan.encode(), "tiny.json": HF_CONFIGS["tiny-llama"].encode(), "file.txt": b"x", "dir": DIR}
    argv = ["run", "{d}/plan.json", *TINY_RUN]
    for _ in range(rng.choice([1, 2, 2, 3])):
        if rng.random() < 0.15:
            argv.append(rng.choice(RUN_FLAGS))
            continue
        option = rng.choice(sorted(RUN_OPTIONS))
        good, bad = RUN_OPTIONS[option]
        value = rng.choice(good) if good and rng.random() < 0.15 else rng.choice(bad)
        argv += [option, _run_value(option, value)]
    if rng.random() < 0.15:
        argv.append("--reference")
    faults = any(a.startswith("--fault") for a in argv)
    return Case("runopts", argv, files, (), False, (), faults)


def _mangled_json(rng: random.Random, text: str) -> str:
    """A config.json with one key's value made hostile, one key dropped, or an unknown key added."""
    obj = json.loads(text)
    key = rng.choice(sorted(obj))
    edit = rng.random()
    if edit < 0.6:
        obj[key] = rng.choice([0, -1, 1, 3, 2 ** 40, 2 ** 70, 1.5, None, "x", [], {}, True, "Flash", "fp8", 1e300])
    elif edit < 0.8:
        del obj[key]
    else:
        obj[rng.choice(["nope", "attention", "dtype", "model_type", "ffn", "num_experts", "torch_dtype"])] = rng.choice(
            ["Flash", "fp8", "bfloat16", "x", 2, "mixtral", "gpt2", "qwen2_moe"])
    return json.dumps(obj, indent=1)


def _mangled_model(rng: random.Random, text: str) -> str:
    """A model TOML with a key's value made hostile (strings too), a key dropped, or a key added."""
    lines = text.splitlines()
    keyed = [i for i, line in enumerate(lines) if re.match(r"^\w+\s*=", line)]
    i = rng.choice(keyed)
    key = lines[i].split("=")[0].strip()
    edit = rng.random()
    if edit < 0.6:
        lines[i] = f"{key} = " + rng.choice(["0", "-1", "3", "1.5", '"x"', '"Flash"', '"fp8"', "true", "1e999",
                                             "99999999999999999999", "[]", '""', "2048"])
    elif edit < 0.8:
        del lines[i]
    else:
        lines.append(rng.choice(['attention = "Flash"', 'dtype = "fp8"', "nope = 1", 'mlp = "relu"', "ffn = 0",
                                 'norm = "batchnorm"', "experts = 8", "kv_heads = 3", 'family = "bert"']))
    return "\n".join(lines) + "\n"


def describe_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """Model descriptions' keys, in TOML and Hugging Face config.json (tests/data/hf*), mangled, read by
    simulate, tune, calibrate and the runtime (the one reader: what one refuses the others refuse)."""
    if rng.random() < 0.5:
        name = rng.choice(sorted(HF_CONFIGS))
        text = HF_CONFIGS[name] if rng.random() < 0.15 else _mangled_json(rng, HF_CONFIGS[name])
        path = "config.json"
    else:
        name = rng.choice(sorted(MODEL_TOMLS))
        text = MODEL_TOMLS[name] if rng.random() < 0.15 else _mangled_model(rng, MODEL_TOMLS[name])
        path = "model.toml"
    files = {path: text.encode(), "plan.json": b"@plan"}
    f = "{d}/" + path
    argv = rng.choice([
        ["simulate", "1f1b", "--cluster", "dgx-h100-80gb", "--model", f, "--global-batch", "16"],
        ["check", "1f1b", "--model", f, "--microbatch-size", "1"],
        ["tune", "--model", f, "--cluster", "dgx-h100-80gb", "--gpus", "8", "--global-batch", "16", "--schedules", "1f1b"],
        ["run", "{d}/plan.json", "--model", f, "--steps", "1", "--threads", "1", "--quiet", "--timeout", "15",
         "--reference", "--mb-size", "1"],
        ["calibrate", "-o", "{d}/c.toml", "--cluster", "dgx-a100-80gb", "--costs", "{d}/p.json", "--model", f]])
    files["p.json"] = b'{"unit": "ms", "F": [50, 60], "B": [100, 120], "microbatch_size": 1}'
    return Case("describe", argv, files, (path,) if argv[0] in ("simulate", "check") else (), False, (path,))


OVERHEADS = ["f_us = 100.0\nb_us = 200.0", "f_us = -1", "f_us = 1e999", "nope_us = 1", "f_us = \"x\"", "",
             "f_us = 0\nb_us = 0\ni_us = 0\nw_us = 0", "f_us = 1e15", "b_us = nan"]
UNITS = ['"ms"', '"s"', '"us"', '"x"', "5", "null", '"units"']


def calibrate2_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """calibrate and simulate with a cluster that has an [overhead] table, profiles in declared units
    (s, ms, us, none, junk), profiles at two sizes (the overhead fit) and a refit of calibrate's own output."""
    files = {"small.toml": SMALL_MODEL.encode(),
             "big.toml": SMALL_MODEL.replace("layers = 4", "layers = 8").replace("hidden = 256", "hidden = 512").encode(),
             "cluster.toml": (CLUSTER_TOML + f"\n[overhead]\n{rng.choice(OVERHEADS)}\n").encode()}
    for name, scale in (("p1.json", 1.0), ("p2.json", rng.choice([2.0, 4.0, 1.0, 0.0, 1e9]))):
        unit = rng.choice(UNITS)
        f, b = [round(50 * scale, 3), round(60 * scale, 3)], [round(100 * scale, 3), round(120 * scale, 3)]
        files[name] = json.dumps({"F": f, "B": b, "microbatch_size": 1}).replace("{", '{"unit": ' + unit + ", ", 1).encode()
    cluster = rng.choice(["{d}/cluster.toml", "dgx-a100-80gb"])
    kind = rng.random()
    if kind < 0.3:
        argv = ["simulate", "1f1b", "--cluster", cluster, "--model", "{d}/small.toml", "--global-batch", "8"]
    else:
        argv = ["calibrate", "-o", "{d}/c.toml", "--cluster", cluster, "--costs", "{d}/p1.json", "--model",
                "{d}/small.toml"]
        if rng.random() < 0.5:
            argv += ["--costs", "{d}/p2.json", "--model", "{d}/big.toml"]
        if rng.random() < 0.3:
            argv += ["--microbatch-size", rng.choice(["1", "2"])]
    return Case("calibrate", argv, files, ("cluster.toml",) if argv[0] == "simulate" else (), False,
                ("cluster.toml", "p1.json", "p2.json"))


def budget_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """tune and synthesis at and just past their budgets: synthesis near budget.SYNTHESIS_OPS (p = 16,
    m = 208; p = 64, m = 52), the offload search for 175B on 1,024 GPUs, large GPU counts."""
    if rng.random() < 0.5 or not allow_slow:  # in process: only the sizes just past the budget (refused at once)
        sizes = [(16, 208), (64, 52), (32, 104), (16, 209), (64, 53), (8, 416), (2, 1666), (128, 26)]
        p, m = rng.choice(sizes if allow_slow else [(16, 209), (64, 53), (128, 27)])
        argv = ["tune", "--synthesize", "-D", f"p={p}", "-D", f"m={m}"]
        if rng.random() < 0.7:
            argv += ["--activation-limit", rng.choice(["1", "2", "4", str(p), str(2 * p), "1e400"])]
        if rng.random() < 0.3:
            argv += ["--memory-limit", rng.choice(["1e400GiB", "80GiB", "1"])]
        return Case("budget", argv, {}, (), False)
    argv = ["tune", "--model", rng.choice(["gpt-175b", "gpt-1008b", "llama3.1-70b", "gpt-18.4b"]), "--cluster",
            rng.choice(["dgx-a100-80gb", "dgx-h100-80gb"]), "--gpus", rng.choice(["1024", "512", "4096", "3072"]),
            "--global-batch", rng.choice(["1536", "2048", "1024"])]
    argv += rng.choice([["--schedules", "offload_1f1b"], ["--schedules", "1f1b,offload_1f1b"], ["--schedules", "seq1f1b"],
                        [], ["--schedules", "interleaved_1f1b", "--zero", "0,1,2,3"]])
    if rng.random() < 0.3:
        argv += ["--walk-ops", rng.choice(["1000000", "5000000", "1"])]
    return Case("budget", argv, {}, (), False)


API_SIZES = [0, -1, 1, 2, 4, 8, True, 2.0, "4", None, 10 ** 30, {"$": "nan"}, 1000000]
API_FILES = ["1f1b", "v_half", "zbv", "interleaved_1f1b", "nope", "", "{d}/mine.sched", "{d}/file.txt", "seq1f1b",
             "offload_1f1b", "dualpipev", "{d}"]


def api_case(rng: random.Random, allow_slow: bool = True) -> Case:
    """The torch API (schedc.torch) with hostile arguments: sizes of every type, ranks out of range, a
    misspelt format, params that repeat p or m, stages that are not this rank's; each call must return
    its documented value or raise ScheduleError."""
    size = (lambda: rng.choice(API_SIZES)) if rng.random() < 0.5 else (lambda: rng.choice([1, 2, 4, 8]))
    kwargs = {"file": rng.choice(API_FILES), "p": size()}
    function = rng.choice(["stage_indices", "orders", "schedule"])
    if function == "stage_indices":
        kwargs["rank"] = rng.choice([0, 1, -1, 5, 2.0, "0", None, 10 ** 20])
        if rng.random() < 0.5:
            kwargs["n_microbatches"] = size()
    else:
        kwargs["n_microbatches"] = size()
    if function != "stage_indices" and rng.random() < 0.3:
        kwargs["format"] = rng.choice(["compute_only", "compute_comms", "csv", "Compute_Only", None, 1])
    if rng.random() < 0.3:
        kwargs.update(rng.choice([{"v": 2}, {"p": 4}, {"m": 8}, {"v": "x"}, {"k": 2}, {"v": 10 ** 9}, {"nope": 1}]))
    if function == "schedule":  # stages that never match the placement (torch would be reached otherwise)
        kwargs["stages"] = rng.choice([[], None, 5, "x", [{"stage_index": 99, "group_size": 2, "group_rank": 0,
                                                             "num_stages": rng.choice([2, 4])}],
                                       {"stage_index": -1, "group_size": rng.choice([1, 2, 4]), "group_rank": 0,
                                        "num_stages": 4}])
        kwargs.pop("p") if rng.random() < 0.5 else None
    files = {"mine.sched": mutate_sched(rng, LIBRARY["1f1b"]).encode() if rng.random() < 0.5 else LIBRARY["1f1b"].encode(),
             "file.txt": b"x"}
    return Case("api", ["@api", function, json.dumps(kwargs)], files, (), False)


def _api_value(value):
    """A JSON argument as the API receives it: {"$": "nan"} a float NaN, an object with stage_index a
    stand-in PipelineStage (attributes only)."""
    from types import SimpleNamespace
    if isinstance(value, dict) and set(value) == {"$"}:
        return float(value["$"])
    if isinstance(value, dict) and "stage_index" in value:
        return SimpleNamespace(**value)
    if isinstance(value, list):
        return [_api_value(v) for v in value]
    return value


def api_main(argv: list[str], directory: str) -> int:
    """Run an api case: 0 with the result printed, 2 with `error: ...` for a ScheduleError; anything else
    raised propagates (a traceback, the defect). A result of the wrong shape is reported as an error, exit 3."""
    import schedc.torch as api
    function, kwargs = argv[0], json.loads(argv[1].replace("{d}", directory))
    kwargs = {k: _api_value(v) for k, v in kwargs.items()}
    try:
        result = getattr(api, function)(**kwargs)
    except api.ScheduleError as exc:
        print(f"error: {exc}")
        return 2
    if function == "stage_indices" and not (isinstance(result, tuple) and all(type(s) is int and s >= 0 for s in result)):
        print(f"error: stage_indices returned {result!r}")
        return 3
    if function == "orders" and not (isinstance(result, list) and len(result) == kwargs["p"]):
        print(f"error: orders returned {len(result)} rows for p={kwargs['p']}")
        return 3
    print(repr(result)[:2000])
    return 0


GENERATORS = {"sched": (sched_case, 40), "define": (define_case, 10), "csv": (csv_case, 20),
              "plan": (None, 15), "options": (option_case, 10), "tune": (tune_case, 6), "inputs": (input_case, 10),
              "expand": (expand_case, 5), "calibrate": (calibrate_case, 3), "checkpoint": (checkpoint_case, 2),
              "outputs": (output_case, 8), "resume": (resume_case, 2), "runopts": (runopt_case, 7), "api": (api_case, 5),
              "describe": (describe_case, 6), "calibrate2": (calibrate2_case, 3), "budget": (budget_case, 1)}


PLACEHOLDERS: dict[bytes, bytes] = {}  # "@plan-seq1f1b" -> that plan's bytes, where the runner compiled it
CHECKPOINT: Path | None = None  # a checkpoint of TINY_RUN on the small plan, where the runner made one


def write_case(case: Case, directory: Path, small_plan: bytes) -> None:
    """The case's files in `directory`: a plan placeholder becomes a small valid plan, FULL a device
    that refuses every write with ENOSPC (a character device 1:7 when this process may make one,
    else left out)."""
    import os
    import shutil
    import stat
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in case.files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        if data in (FIFO, ZERO, DIR):
            {FIFO: os.mkfifo, DIR: os.mkdir, ZERO: lambda path: os.symlink("/dev/zero", path)}[data](directory / name)
            continue
        if data == FULL:
            try:
                os.mknod(directory / name, stat.S_IFCHR | 0o666, os.makedev(1, 7))
            except OSError:
                pass
            continue
        if data == CKPT:
            if CHECKPOINT is not None:
                shutil.copytree(CHECKPOINT, directory / name, dirs_exist_ok=True)
            continue
        (directory / name).write_bytes(small_plan if data == b"@plan" else PLACEHOLDERS.get(data, data))
    digests = {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in case.kept
               if (directory / name).is_file()}
    (directory / ".kept.json").write_text(json.dumps(digests))


def generators() -> dict:
    """Every category's generator and weight: this module's and the fourth round's (fuzz_layout.py: the
    layout's newest options, config.json files, the cluster files' newest tables; built on this one)."""
    import fuzz_layout
    return {**GENERATORS, **fuzz_layout.GENERATORS}


def cases(seed: int, count: int, plans: dict[str, dict], allow_slow: bool = True) -> list[Case]:
    """`count` cases drawn in fixed proportions (see generators()), the same for the same seed."""
    rng = random.Random(seed)
    every = generators()
    names, weights = zip(*((n, w) for n, (_, w) in every.items()))
    out = []
    for _ in range(count):
        kind = rng.choices(names, weights)[0]
        case = plan_case(rng, plans, allow_slow) if kind == "plan" else every[kind][0](rng, allow_slow)
        out.append(case)
    return out


# Verdicts -------------------------------------------------------------------------------------

_ERROR_LINE = re.compile(r"^(.*?)(:\d+:\d+)?: error: (.*)$", re.M)
_PLAN_REFUSED = re.compile(r"plan\.json(:\d+:\d+)?: error: ")  # `schedc run` refusing a plan that fails its checks
_NONFINITE = re.compile(r"(?<![\w.])(-?inf|nan|Infinity|NaN)(?![\w])", re.I)


def classify(case: Case, directory: str, code: int | None, output: str, timed_out: bool) -> str:
    """One outcome (see OUTCOMES) for a finished case; `code` None when killed by a signal."""
    if timed_out:
        return "timeout"
    if "MemoryError" in output:
        return "memory"
    if "Traceback (most recent call last)" in output:
        return "traceback"
    if code not in (0, 1, 2):
        return "bad-exit"
    if _lost(case, directory):
        return "data-loss"
    if code == 1 and case.argv[0] == "run" and not case.fails_late and ("failed first" in output or (
            "--reference" in case.argv and not _PLAN_REFUSED.search(output))):
        return "late-refusal"  # a rank (or the one-process run) failed on what the pre-launch check could see
    if code == 0:
        stdout_numbers = output.split("\n#stderr#\n", 1)[0]
        if case.argv[0] in ("simulate", "compile") and _NONFINITE.search(stdout_numbers):
            return "nonfinite"
        return "ok"
    if "error" not in output.lower():
        return "silent"
    inputs = {f"{directory}/{name}" for name in case.inputs}
    for path, where, message in _ERROR_LINE.findall(output):
        if path.strip() in inputs and not where and not re.search(r"-D|--\w", message):
            return "unlocated"
    if code == 1 and case.argv[0] == "simulate" and re.search(r"utilization|\"makespan\"", output):
        return "invalid-stats"
    return "failed" if code == 1 else "usage"


def _lost(case: Case, directory: str) -> bool:
    """A file the user gave that the case changed or deleted (write_case kept their digests)."""
    if not case.kept:
        return False
    digests = json.loads((Path(directory) / ".kept.json").read_text())
    return any(not (Path(directory) / name).is_file()
               or hashlib.sha256((Path(directory) / name).read_bytes()).hexdigest() != digest
               for name, digest in digests.items())


def launched(case: Case, code: int | None, output: str) -> bool:
    """Whether a `run` case started torchrun: it trained (exit 0) or a rank failed."""
    return case.argv[:1] == ["run"] and "--reference" not in case.argv and (code == 0 or "failed first" in output)
