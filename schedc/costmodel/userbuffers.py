"""What Transformer Engine's userbuffers overlap (`--tp-comm-overlap`) costs the GEMMs beside it: the
optional [userbuffers.NAME] tables of a cluster file, each the streaming multiprocessors a layer's linear
GEMMs run without while their tensor-parallel communication holds them, and [gpu] sms.

    [gpu]
    sms = 132                     # the GPU's streaming multiprocessors

    [userbuffers.fp8_h8192_tp4]   # one overlap configuration; the first whose given facts all match
    fp8 = true                    # the run's (optional: --fp8 or not)
    hidden = 8192                 # optional: the model's hidden size
    tp = 4                        # optional: --tp
    cp = 1                        # optional: --cp
    proj_fprop = 1                # SMs the projection's forward GEMM runs without; any of
    qkv_wgrad = 24                # {qkv, proj, fc1, fc2}_{fprop, dgrad, wgrad}, 0 when not given

A table with none of the four facts matches every run: written last, it is the default. Transformer
Engine's names: qkv the attention's input projection, proj its output projection, fc1 the MLP's first
(SwiGLU's gate and up), fc2 its second; fprop the forward, dgrad the input gradient, wgrad the weight
gradient. A GEMM that gives up n of the GPU's S SMs runs at (S - n) / S of its rate: Transformer Engine
hands cuBLAS S - num_sm SMs where a configuration sets set_sm_margin, and a bulk overlap's
communication kernel holds its num_sm SMs beside the GEMM either way (see docs/cluster.md, "The
userbuffers tables", for which configuration counts which SMs).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..diagnostics import Diagnostic, Source, error
from .located import locate, unknown_keys

GEMMS = ("qkv", "proj", "fc1", "fc2")          # a layer's linear GEMMs in forward order (stages.linear_gemms')
PASSES = ("fprop", "dgrad", "wgrad")           # forward, input gradient, weight gradient
TAKEN_KEYS = tuple(f"{gemm}_{p}" for p in PASSES for gemm in GEMMS)
MATCH_KEYS = ("fp8", "hidden", "tp", "cp")
MAX_SMS = 100_000


@dataclass(frozen=True, slots=True)
class OverlapConfig:
    """One [userbuffers.NAME] table: the run facts it is for (None: any) and the SMs each GEMM loses."""

    name: str
    fp8: bool | None = None
    hidden: int | None = None
    tp: int | None = None
    cp: int | None = None
    taken: tuple[tuple[str, int], ...] = ()   # (TAKEN_KEYS name, SMs), those given

    def matches(self, fp8: bool, hidden: int, tp: int, cp: int) -> bool:
        facts = (("fp8", fp8), ("hidden", hidden), ("tp", tp), ("cp", cp))
        return all(getattr(self, key) in (None, value) for key, value in facts)


@dataclass(frozen=True, slots=True)
class Userbuffers:
    """The GPU's SMs and the overlap configurations in the file's order."""

    sms: int
    configs: tuple[OverlapConfig, ...]

    def config(self, fp8: bool, hidden: int, tp: int, cp: int) -> OverlapConfig | None:
        return next((c for c in self.configs if c.matches(fp8, hidden, tp, cp)), None)

    def rates(self, gemm_pass: str, fp8: bool, hidden: int, tp: int, cp: int) -> tuple[float, ...]:
        """The share of its rate each of the four GEMMs (GEMMS' order) keeps in `gemm_pass`: (S - n) / S.

        >>> ub = Userbuffers(132, (OverlapConfig("a", tp=4, taken=(("proj_fprop", 24), ("fc2_fprop", 16))),))
        >>> [round(r, 4) for r in ub.rates("fprop", True, 8192, 4, 1)], ub.rates("fprop", True, 8192, 8, 1)
        ([1.0, 0.8182, 1.0, 0.8788], (1.0, 1.0, 1.0, 1.0))
        """
        found = self.config(fp8, hidden, tp, cp)
        taken = dict(found.taken) if found else {}
        return tuple((self.sms - taken.get(f"{gemm}_{gemm_pass}", 0)) / self.sms for gemm in GEMMS)


def read_userbuffers(table: dict, source: Source, diags: list[Diagnostic]) -> Userbuffers | None:
    """The cluster's [userbuffers.*] tables and [gpu] sms (None without the tables: sms is read only for
    them, and checked either way); every bad key located in diags."""
    gpu = table.get("gpu") if isinstance(table.get("gpu"), dict) else {}
    sms = gpu.get("sms")
    if sms is not None and not (isinstance(sms, int) and not isinstance(sms, bool) and 1 <= sms <= MAX_SMS):
        diags.append(error(f"'gpu.sms' must be an integer from 1 to {MAX_SMS}, got {sms!r} (the GPU's streaming "
                           "multiprocessors)", locate(source, "sms", "gpu")))
        return None
    given = table.get("userbuffers")
    if not isinstance(given, dict):
        return None
    if sms is None:
        diags.append(error("missing field 'gpu.sms' (the GPU's streaming multiprocessors, which the "
                           "[userbuffers.*] tables take SMs of)", locate(source, "sms", "gpu")))
        return None
    before = len(diags)
    configs = tuple(_config(name, entry, sms, source, diags) for name, entry in given.items())
    return None if len(diags) > before else Userbuffers(sms, configs)


def _config(name: str, entry: object, sms: int, source: Source, diags: list[Diagnostic]) -> OverlapConfig:
    """One [userbuffers.NAME] table, its errors located in diags."""
    where = lambda k: locate(source, k, f"userbuffers.{name}")  # noqa: E731
    if not isinstance(entry, dict):
        diags.append(error(f"'userbuffers.{name}' must be a table: [userbuffers.{name}]",
                           locate(source, name, "userbuffers")))
        return OverlapConfig(name)
    keys = (*MATCH_KEYS, *TAKEN_KEYS)
    diags += unknown_keys([k for k in entry if k not in keys],
                          lambda k: f"unknown key 'userbuffers.{name}.{k}' (keys: {', '.join(keys)})", where)
    facts: dict[str, object] = {}
    for key in MATCH_KEYS:
        value = entry.get(key)
        good = value is None or (isinstance(value, bool) if key == "fp8" else
                                 isinstance(value, int) and not isinstance(value, bool) and value >= 1)
        if not good:
            want = "true or false" if key == "fp8" else "a positive integer"
            diags.append(error(f"'userbuffers.{name}.{key}' must be {want}, got {value!r} (the runs this "
                               "configuration is for)", where(key)))
        facts[key] = value if good else None
    taken = []
    for key in TAKEN_KEYS:
        value = entry.get(key)
        if value is None:
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and 0 <= value < sms):
            diags.append(error(f"'userbuffers.{name}.{key}' must be an integer from 0 to {sms - 1} (of the "
                               f"GPU's {sms} SMs), got {value!r} (SMs the GEMM runs without)", where(key)))
            continue
        taken.append((key, value))
    return OverlapConfig(name, facts["fp8"], facts["hidden"], facts["tp"], facts["cp"], tuple(taken))


def dump_userbuffers(ub: Userbuffers | None) -> str:
    """The [userbuffers.*] tables' TOML text (read_userbuffers reads them back alike; [gpu] sms is
    written by specs.dump_cluster); '' for None."""
    if ub is None:
        return ""
    out = []
    for c in ub.configs:
        facts = [(k, getattr(c, k)) for k in MATCH_KEYS if getattr(c, k) is not None]
        lines = [f"{k} = {'true' if v is True else 'false' if v is False else v}" for k, v in facts]
        out.append(f"\n[userbuffers.{_key(c.name)}]\n" + "".join(f"{line}\n" for line in lines + [f"{k} = {v}" for k, v in c.taken]))
    return "".join(out)


def _key(name: str) -> str:
    """A table name as TOML writes it: bare when it can be, else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name)
