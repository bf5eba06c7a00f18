"""DeepSeek-V3's Table 2 for DualPipe against an independent construction: deepseek-ai/DualPipe's
dualpipe.py step logic timed by hand (benchmarks/dualpipe_reference.py, which imports nothing of schedc).
schedc's `dualpipe` library order under its simulator idles as the reference does on every rank, for any
F, I, W and F&B; the report's (PP/2-1)(F&B + B - 3W) is that bubble when I = F and not otherwise."""
from __future__ import annotations

import importlib.util
import random
import sys

import pytest

from conftest import ROOT, SCHEDULES
from schedc.driver import compile_source, read_source
from schedc.frontend.elaborate import Options

spec = importlib.util.spec_from_file_location("dualpipe_reference", ROOT / "benchmarks" / "dualpipe_reference.py")
reference = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = reference  # the dataclass looks its module up while it is made
spec.loader.exec_module(reference)


def _simulated(pp: int, m: int, f: float, i: float, w: float, fb: float) -> list[float]:
    costs = {"F": f, "B": i + w, "I": i, "W": w, "FB": fb}
    done = compile_source(read_source(SCHEDULES / "dualpipe.sched"), Options({"p": str(pp), "m": str(m)}, costs=costs))
    assert done.ok, [d.message for d in done.diagnostics]
    return done.stats["idle"]


def test_the_reference_s_chunk_lists_follow_dualpipe_py_s_steps():
    """PP 4, 8 microbatches, rank 0 (half_rank 0): step 1 two F0, step 2 one F0 F1, step 3 one I1 W F1,
    step 4 (8/2 - 4 + 0 + 1 = 1) F0&B1 and F1&B0, step 5 one B1 and F1&B0, step 6 B1 then I0 (half_rank
    even: the split starts at chunk 0 of i = 0), step 7 one W I0, step 8 one W: 8 forwards and 8
    backwards (4 per direction), 4 weight gradients deferred and 4 run."""
    kinds = [c.kind + (str(c.phase) if c.kind != "W" else "") + (str(c.phase_b) if c.kind == "FB" else "")
             for c in reference.rank_chunks(0, 4, 8)]
    assert kinds == ["F0", "F0", "F0", "F1", "I1", "W", "F1", "FB01", "FB10", "B1", "FB10", "B1", "I0",
                     "W", "I0", "W"]


@pytest.mark.parametrize("pp", [4, 8, 16])
def test_the_reference_gives_the_report_s_bubble_when_i_equals_f(pp):
    """F = 1, I = 1, W = 1 (B = 2), F&B = 2.5: (PP/2 - 1)(2.5 + 2 - 3) = 1.5 per half pipeline more."""
    t = reference.timeline(pp, 2 * pp, 1.0, 2.0, 1.0, 2.5)
    assert max(t["idle"]) == pytest.approx((pp // 2 - 1) * 1.5, rel=1e-12)


def test_schedc_s_dualpipe_idles_as_the_reference_on_every_rank():
    """Random chunk times (F&B between the longer half and the sum), PP 4 to 16, m = 2 PP and 3 PP: each
    rank's idle time (makespan - busy) equal to the reference's."""
    rng = random.Random(39)
    for _ in range(8):
        pp, k = rng.choice([4, 6, 8, 16]), rng.choice([2, 3])
        f, i, w = rng.uniform(0.5, 2), rng.uniform(0.5, 3), rng.uniform(0.2, 1.5)
        fb = rng.uniform(max(f, i + w), f + i + w)
        ref = reference.timeline(pp, k * pp, f, i + w, w, fb)["idle"]
        assert _simulated(pp, k * pp, f, i, w, fb) == pytest.approx(ref, rel=1e-9)


@pytest.mark.parametrize("pp, expected", [(8, 9.5), (16, 23.5)])
def test_with_i_above_f_the_formula_is_not_the_schedule_s_bubble(pp, expected):
    """F = 1, I = 2, W = 1 (B = 3), F&B = 3.5: the formula says (PP/2 - 1)(3.5 + 3 - 3) = 10.5 (PP 8) and
    24.5 (PP 16); the reference's step logic idles 9.5 and 23.5, and so does schedc."""
    assert max(reference.timeline(pp, 2 * pp, 1.0, 3.0, 1.0, 3.5)["idle"]) == pytest.approx(expected)
    assert max(_simulated(pp, 2 * pp, 1.0, 2.0, 1.0, 3.5)) == pytest.approx(expected)
    assert (pp // 2 - 1) * 3.5 == pytest.approx(expected + 1)
