"""golden plans: every library schedule at three sizes and every fixture compiles to the same bytes as
when tests/golden/plans.json was written (sha256 of plan.json, each rank*.txt, the stats JSON and the
diagnostics, first 16 hex digits). A refactor that moves code must leave these unchanged; regenerate
on purpose only, with `pytest tests/test_golden_plans.py --regen-golden`, and say why in the commit."""
from __future__ import annotations

import hashlib
from pathlib import Path
import json

from conftest import ROOT
from schedc.diagnostics import SchedError

GOLDEN = ROOT / "tests" / "golden" / "plans.json"
LIBRARY_ROOT = ROOT / "schedc"  # the library's schedules/ folder lies here

SIZES = {
    "gpipe": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "1f1b": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "interleaved_1f1b": [{"p": 2, "v": 2, "m": 4}, {"p": 3, "v": 3, "m": 6}, {"p": 4, "v": 2, "m": 8}],
    "chimera": [{"p": 2, "m": 2}, {"p": 4, "m": 4}, {"p": 4, "m": 8}],
    "pipefisher": [{"p": 2, "m": 2}, {"p": 4, "m": 4}, {"p": 4, "m": 8, "c": 2, "k": 3}],
    "pipefisher_1f1b": [{"p": 2, "m": 2}, {"p": 3, "m": 6}, {"p": 4, "m": 8, "c": 2, "k": 3}],
    "zb_h1": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "zb_h2": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "zb_2p": [{"p": 2, "m": 2}, {"p": 3, "m": 9}, {"p": 4, "m": 13}],
    "zbv": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "v_half": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "v_min": [{"p": 2, "m": 2}, {"p": 3, "m": 5}, {"p": 4, "m": 8}],
    "interleaved_zb": [{"p": 2, "v": 2, "m": 4}, {"p": 3, "v": 3, "m": 6}, {"p": 4, "v": 2, "m": 8}],
    "looped_bfs": [{"p": 2, "v": 2, "m": 4}, {"p": 3, "v": 3, "m": 5}, {"p": 4, "v": 2, "m": 8}],
    "dualpipe": [{"p": 2, "m": 4}, {"p": 4, "m": 8}, {"p": 4, "m": 12}],
    "dualpipev": [{"p": 2, "m": 4}, {"p": 3, "m": 7}, {"p": 4, "m": 10}],
    "seq1f1b": [{"p": 2, "m": 2, "k": 2}, {"p": 4, "m": 4, "k": 4}],
    "interleaved_1f1b_recompute": [{"p": 2, "v": 2, "m": 2}, {"p": 4, "v": 2, "m": 8}],
    "offload_1f1b": [{"p": 2, "m": 2}, {"p": 4, "m": 8}],
}
LATENCY = {"1f1b": 0.25, "chimera": 0.5}  # the largest size is also compiled with this message latency


def _cases() -> list[tuple[str, str, tuple[str, ...], float]]:
    """(case name, path, -D defines, latency): a library schedule's path is relative to the package
    (schedules/NAME.sched, compiled from inside schedc/), a fixture's to the repository."""
    cases = []
    for name, sizes in SIZES.items():
        for params in sizes:
            defines = tuple(f"{k}={v}" for k, v in params.items())
            cases.append((f"{name} {' '.join(defines)}", f"schedules/{name}.sched", defines, 0.0))
        if name in LATENCY:
            cases.append((f"{name} {' '.join(defines)} latency={LATENCY[name]}", f"schedules/{name}.sched",
                          defines, LATENCY[name]))
    fixtures = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / "fixtures").rglob("*")
                      if p.suffix in (".sched", ".csv"))
    return cases + [(path, path, (), 0.0) for path in fixtures]


def _digest(data: str | bytes) -> str:
    """The first 16 hex digits of the sha256 of `data`; the checkout's own path (library files are named
    by it in diagnostics) is taken out first, so the goldens hold in any clone."""
    if isinstance(data, str):
        from importlib.resources import files
        for root in (Path(str(files("schedc.schedules"))).parent, Path(__file__).resolve().parent.parent):
            data = data.replace(f"{root}/", "")
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _compile(path: str, defines: tuple[str, ...], latency: float):
    from schedc.driver import compile_file
    return compile_file(path, defines, None, latency)


def _hashes(path: str, defines: tuple[str, ...], latency: float, out) -> dict[str, str]:
    """What the compile of one case produced, hashed: its error, or its diagnostics, stats and files."""
    from schedc.plan.write import write_plan
    try:
        result = _compile(path, defines, latency)
    except SchedError as exc:
        return {"error": _digest(exc.render())}
    source = result.schedule.source
    found = {"diagnostics": _digest("\n".join(d.format(source) for d in result.diagnostics)),
             "stats": _digest(json.dumps(dict(result.stats), sort_keys=True))}
    if result.plan is not None:
        _, written = write_plan(result.plan, out)
        found.update({p.name: _digest(p.read_bytes()) for p in written})
    return found


def test_plans_match_the_goldens(tmp_path, monkeypatch, regen_golden):
    # plan.json records the source path as given, so each case compiles from where its path starts
    found = {}
    for n, (name, path, defines, latency) in enumerate(_cases()):
        monkeypatch.chdir(LIBRARY_ROOT if path.startswith("schedules/") else ROOT)
        found[name] = _hashes(path, defines, latency, tmp_path / f"case{n}")
    if regen_golden:
        GOLDEN.write_text(json.dumps(found, indent=0, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sum("plan.json" in v for v in golden.values()) >= 18  # the library cases all lower
    changed = sorted(name for name in golden.keys() | found.keys() if golden.get(name) != found.get(name))
    assert not changed, f"outputs differ from tests/golden/plans.json for: {changed}"
