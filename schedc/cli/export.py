"""`schedc export`: torch.distributed.pipelining's CSV formats."""
from __future__ import annotations

import json

import click

from ..diagnostics import SchedError
from ..outputs import is_stdout, write_output
from .group import main
from .options import define_option, reshard_option, with_option
from .common import fail, report, finish, refuse_clash




@main.command("export")
@click.argument("file")
@define_option
@click.option("--format", "fmt", type=click.Choice(["torch-csv", "torch-comms"]), default="torch-csv",
              show_default=True, help="torch-csv: compute-only; torch-comms: with SEND/RECV cells (compute_comms).")
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="The CSV to write; - prints it.")
@with_option
@reshard_option
def export_cmd(file, defines, fmt, out, addons, reshard_after_forward):
    """Export FILE's per-rank order (torch.distributed.pipelining CSV)."""
    if reshard_after_forward is not None and fmt != "torch-comms":
        raise click.UsageError("--reshard-after-forward places UNSHARD and RESHARD cells, which only "
                               "--format torch-comms holds")
    from ..driver import compile_file
    from ..interop.torch_comms import export_comms_csv
    from ..interop.torch_csv import export_csv
    from ..interop.torch_placement import sidecar_path
    refuse_clash([("FILE", file)], [("-o", out), ("the placement beside -o", str(sidecar_path(out)) if out not in ("", "-") else None)])
    try:
        result = compile_file(file, defines, None, 0.0, addons=addons)
        if not result.ok:
            report(result.diagnostics, result.schedule.source)
            finish(result.diagnostics)
        text = export_csv(result.schedule)  # refuses what torch's format cannot hold, for both formats
    except SchedError as exc:
        fail(exc)
    from ..interop.torch_placement import describe, sidecar, sidecar_path
    comms = fmt == "torch-comms"
    try:
        write_output(out, export_comms_csv(result.plan, reshard_after_forward) if comms else text)
        if not is_stdout(out):
            stated = sidecar(result.schedule, out, "compute_comms" if comms else "compute_only")
            write_output(str(sidecar_path(out)), json.dumps(stated, indent=1) + "\n")
    except SchedError as exc:
        fail(exc)
    if not is_stdout(out):  # `-o -` prints the CSV alone, for a pipe
        line = describe(result.schedule.pipelines[0].placement, result.schedule.devices)
        click.echo(f"wrote {out} and {sidecar_path(out)}\n{line}")
