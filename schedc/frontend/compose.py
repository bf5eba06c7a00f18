"""Composition: a schedule built from another (`extends`) and add-ons (`use`), resolved into one
ScheduleDecl before elaboration, as Lark's `%import` brings another grammar's rules under a prefix.

    schedule pipefisher "..."          addon kfac "..."
    extends chimera                    param kron = 0.48 "..."
    use kfac                           task inversion(s) = 8 after ...
    param p = 8                        fill bubbles with ...
    -> chimera's declarations with `param p = 8` in place of chimera's p, then kfac's, its params
       named `kfac.kron` (so `-D kfac.kron=0.3`; a base's `k` and the add-on's cannot meet)

- `extends BASE`: the base's declarations (its own `extends` and `use` resolved first), then this
  file's; a declaration of this file replaces the base's of the same name or kind (a param, a
  pipeline, a task, the cost or memory of a kind, a queue, a device's program, a setting), where the
  base had it, so `param p = 8` changes a default and params that follow still see it.
- `use ADDON [as NS]`: an add-on file (`addon NAME "..."`) adds its declarations; its params become
  `NS.name` (NS the add-on's name unless `as` says), in its own expressions too. Anything else it
  declares (tasks, costs and memory of a kind, settings) must not be declared by the schedule already:
  a clash is an error at the add-on's declaration, naming the other. Fill lists are joined.
- Names are found next to the file that names them (`BASE.sched`, `addons/ADDON.sched`), then in the
  library (schedc/schedules/, schedc/schedules/addons/); a quoted name is a path relative to that file.

Declarations taken from another file keep spans into it, so diagnostics point at the right file.
Unknown names, clashes and cycles of `extends` are errors located at the naming line (exit 1).
"""
from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from . import ast
from ..diagnostics import SCHEDULE, USAGE, SchedError, Source, Span, error
from .params import declared_key
from .library import ADDONS, LIBRARY_PACKAGE, library_addons, library_files
from .parse import parse_source, read_source

MAX_DEPTH = 16  # `extends` chains deeper than this are refused (a cycle is caught before)


def compose(decl: ast.ScheduleDecl, source: Source, addons: tuple[str, ...] = ()) -> ast.ScheduleDecl:
    """`decl` with its `extends` and `use` (and the command line's `--with` add-ons) resolved: one
    declaration list, nothing left to import. A file that composes nothing comes back as it is."""
    if decl.addon:
        raise SchedError(error(f"'{decl.name}' is an add-on, not a schedule: `use {decl.name}` in one, or "
                               f"`schedc compile BASE --with {decl.name}`", decl.span), source, kind=USAGE)
    if not addons and not any(isinstance(d, (ast.Extends, ast.Use)) for d in decl.decls):
        return decl
    extra = tuple(ast.Use(None, name, Path(name).stem) for name in addons)
    return _resolve(replace(decl, decls=decl.decls + extra), source, (_key(source),), source)[0]


def _resolve(decl: ast.ScheduleDecl, source: Source, chain: tuple[str, ...],
             top: Source) -> tuple[ast.ScheduleDecl, dict[str, str]]:
    """The declaration resolved, and the add-ons applied to it (their file -> where: `pipefisher.sched:3`)."""
    own = [d for d in decl.decls if not isinstance(d, (ast.Extends, ast.Use))]
    bases = [d for d in decl.decls if isinstance(d, ast.Extends)]
    if len(bases) > 1:
        raise _error(f"a schedule extends one base (the first at line {bases[0].span.line})", bases[1].span, top)
    decls, applied = own, {}
    if bases:
        base, applied = _base(bases[0], source, chain, top)
        decls = _override(base.decls, own)
    for use in (d for d in decl.decls if isinstance(d, ast.Use)):
        found = _find(use.addon, source, "add-on", use.span, top)
        where = f"`use {use.addon}` at {Path(source.path).name}:{use.span.line}" if use.span else f"--with {use.addon}"
        if _key(found) in applied:
            raise _twice(use, where, applied[_key(found)], top)
        applied[_key(found)] = where
        decls = _add(decls, _addon(use, found, top), use, top)
    return replace(decl, decls=tuple(decls)), applied


def _twice(use: ast.Use, where: str, first: str, top: Source) -> SchedError:
    """An add-on applied a second time (its tasks would clash with themselves): one error, at the second."""
    message = f"add-on '{use.addon}' is applied twice: {where} after {first} (an add-on's work is added once)"
    if use.span is None:
        return SchedError(error(message), Source("--with", ""), kind=USAGE)
    return _error(message, use.span, top)


def _base(ext: ast.Extends, source: Source, chain: tuple[str, ...],
          top: Source) -> tuple[ast.ScheduleDecl, dict[str, str]]:
    found = _find(ext.base, source, "schedule", ext.span, top)
    if _key(found) in chain:
        names = " -> ".join(Path(k).stem for k in (*chain, _key(found)))
        raise _error(f"a cycle of `extends`: {names}", ext.span, top)
    if len(chain) > MAX_DEPTH:  # no cycle: a chain longer than any schedule needs
        names = " -> ".join(Path(k).stem for k in (*chain[:3], "...", *chain[-2:], _key(found)))
        raise _error(f"`extends` chain deeper than {MAX_DEPTH} schedules: {names}", ext.span, top)
    base = _located(parse_source(found), found)
    if base.addon:
        raise _error(f"'{ext.base}' is an add-on: `use {ext.base}`, not `extends`", ext.span, top)
    return _resolve(base, found, (*chain, _key(found)), top)


def _addon(use: ast.Use, found: Source, top: Source) -> list[ast.Decl]:
    addon = _located(parse_source(found), found)
    if not addon.addon:
        raise _error(f"'{use.addon}' is a schedule, not an add-on (one begins `addon NAME`): `extends "
                     f"{use.addon}`", use.span, top)
    nested = next((d for d in addon.decls if isinstance(d, (ast.Extends, ast.Use))), None)
    if nested is not None:
        raise _error("an add-on cannot extend or use another", nested.span, top)
    shaped = next((d for d in addon.decls if isinstance(d, (ast.PipelineDecl, ast.Program))), None)
    if shaped is not None:  # it would clash with, or silently join, the using schedule's own
        what = "a pipeline" if isinstance(shaped, ast.PipelineDecl) else "a program"
        raise _error(f"an add-on cannot declare {what}: it adds tasks, costs, memory and fills to the schedule "
                     "that uses it, whose pipelines and programs these are", shaped.span, top)
    params = {d.name for d in addon.decls if isinstance(d, ast.Param)}
    return [_rewrite(d, _namespaced(params, use.namespace)) for d in addon.decls]


def _override(base: list[ast.Decl], own: list[ast.Decl]) -> list[ast.Decl]:
    """The base's declarations with own ones of the same key in their place, the rest of own after."""
    mine = {key: d for d in own if (key := declared_key(d)) is not None}
    used: set = set()
    out = []
    for d in base:
        key = declared_key(d)
        if key in mine:
            out.append(mine[key])
            used.add(key)
        else:
            out.append(d)
    return out + [d for d in own if declared_key(d) not in used or declared_key(d) is None]


def _add(decls: list[ast.Decl], extra: list[ast.Decl], use: ast.Use, top: Source) -> list[ast.Decl]:
    """decls, then an add-on's; a key both declare is a clash, reported at the add-on's declaration."""
    have = {key: d for d in decls if (key := declared_key(d)) is not None}
    clashes = [error(f"name clash: add-on '{use.namespace}' declares {key[1]}, already declared at "
                     f"{_where(have[key], top)}", d.span)
               for d in extra if (key := declared_key(d)) is not None and key in have]
    if clashes:
        raise SchedError(clashes, top)
    return decls + extra


def _where(d: ast.Node, top: Source) -> str:
    source = (d.span.source if d.span else None) or top
    return f"{Path(source.path).name}:{d.span.line}" if d.span else Path(source.path).name


def _find(name: str, source: Source, kind: str, span: Span | None, top: Source) -> Source:
    """The file `extends`/`use` names: next to the naming file, then in the library; quoted: a path."""
    here = Path(source.path).parent
    library = Path(str(resources.files(LIBRARY_PACKAGE).joinpath(ADDONS)))
    schedules = [here / f"{name}.sched", *[p for p in library_files() if p.stem == name]]
    addons = [here / ADDONS / f"{name}.sched", here / f"{name}.sched", library / f"{name}.sched"]
    quoted = name.endswith(".sched") or "/" in name
    if quoted:  # a path: the file itself is a cycle (_base says so), not a reason to look elsewhere
        candidates = [here / name]
    else:  # the other kind last, so that naming one for the other gets its own message
        candidates = schedules + addons if kind == "schedule" else addons + schedules
    found = [path for path in candidates if _is_file(path)]
    # an unquoted name finds another file than the one naming it (my 1f1b.sched may extend the library's)
    for path in found:
        if quoted or _key(Source(str(path), "")) != _key(source):
            return read_source(path)
    if found:  # only the naming file itself has that name
        return read_source(found[0])
    known = ", ".join(p.stem for p in (library_files() if kind == "schedule" else library_addons()))
    message = f"unknown {kind} '{name}' (the library's: {known})"
    if quoted:  # a path names a file, not a library entry
        message = f"no {kind} file '{name}' next to {Path(source.path).name} (looked for {here.resolve() / name})"
    if span is None:  # --with NAME
        raise SchedError(error(message), Source("--with", ""), kind=USAGE)
    raise _error(message, span, top)


def _is_file(path: Path) -> bool:
    """Whether a path names a file; a name the system refuses (too long, a NUL byte) names none."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _key(source: Source) -> str:
    return str(Path(source.path).resolve())


def _error(message: str, span: Span | None, top: Source) -> SchedError:
    return SchedError(error(message, span), top, kind=SCHEDULE)


def _namespaced(params: set[str], namespace: str) -> Callable[[Any], Any]:
    def rename(node):
        if isinstance(node, ast.Param) and node.name in params:
            return replace(node, name=f"{namespace}.{node.name}")
        if isinstance(node, ast.Name) and node.id in params:
            return replace(node, id=f"{namespace}.{node.id}")
        return node
    return rename


def _located(decl: ast.ScheduleDecl, source: Source) -> ast.ScheduleDecl:
    """The AST with every span pointing into `source` (its declarations go into another file's)."""
    return _rewrite(decl, lambda node: replace(node, source=source) if isinstance(node, Span) else node)


def _rewrite(node, fn: Callable[[Any], Any]):
    """Rebuild a tree of frozen dataclasses and tuples bottom-up, passing every dataclass through fn."""
    if isinstance(node, tuple):
        return tuple(_rewrite(item, fn) for item in node)
    if is_dataclass(node) and not isinstance(node, type) and not isinstance(node, Source):
        changed = {f.name: _rewrite(getattr(node, f.name), fn) for f in fields(node)}
        return fn(replace(node, **changed))
    return node


__all__ = ["compose"]
