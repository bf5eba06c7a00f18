"""`schedc list`: the library schedules and add-ons with their params."""
from __future__ import annotations


import click

from .group import main




@main.command("list")
def list_cmd():
    """List the library schedules with their params (a composed one's all: its base's and its add-ons'),
    then the library's add-ons (`--with NAME`), whose params are named NAME.param."""
    from ..driver import load_declaration, read_source
    from ..frontend.library import library_addons, library_files
    from ..frontend.parse import parse_source
    for path in library_files():
        decl = load_declaration(read_source(path))
        _list_entry(path.stem, decl, "")
    for path in library_addons():
        decl = parse_source(read_source(path))
        _list_entry(f"{path.stem} (add-on)", decl, f"{decl.name}.")


def _list_entry(name: str, decl, prefix: str) -> None:
    from ..frontend import ast
    click.echo(f"{name:<18} {decl.name}: {decl.doc}")
    for d in decl.decls:
        if isinstance(d, ast.Param):
            value = d.default.value if isinstance(d.default, ast.Num) else "(expr)"
            click.echo(f"{'':<20}-D {prefix + d.name + '=' + str(value):<18} {d.doc}")
