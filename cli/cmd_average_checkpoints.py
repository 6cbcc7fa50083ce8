"""`nmt average-checkpoints`: the paper's checkpoint averaging (Section 6.1)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from nmt_cli.common import RunDirOption


def register(app: typer.Typer) -> None:
    # `--inputs a.pt b.pt c.pt` as fairseq spells it: click options take one value each, so
    # the files after the first arrive as extra arguments and are appended in order.
    @app.command("average-checkpoints", context_settings={"allow_extra_args": True})
    def average_checkpoints(
        ctx: typer.Context,
        run_dir: RunDirOption = None,
        last: Annotated[Optional[int], typer.Option("--last", help="Average the last N checkpoints of RUN/checkpoints by update order (the paper: 5 for base, 20 for big).", show_default=False)] = None,
        kind: Annotated[str, typer.Option("--kind", help="Which checkpoints --last counts: all (the most recent by update, whatever wrote them; one file under two names counts once), updates (checkpoint_E_U.pt, the interval checkpoints) or epochs (checkpointE.pt).")] = "all",
        inputs: Annotated[Optional[list[Path]], typer.Option("--inputs", help="Average these checkpoint files instead of --last: --inputs A.pt B.pt ...", show_default=False)] = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Where to write the average (default: RUN/checkpoints/checkpoint_avg.pt).", show_default=False)] = None,
        max_span: Annotated[float, typer.Option("--max-span", help="Warn (stderr) when the checkpoints averaged span more than this share of training, in updates: the paper's windows are under 10%.")] = 0.25,
    ) -> None:
        """Average the parameters of several checkpoints into checkpoint_avg.pt."""
        from nmt.average import average_into, distinct_files, last_checkpoint_infos, span_warning
        from nmt.errors import NmtError
        from nmt.run.directory import RunDir, resolve_run_dir

        from nmt.settings import POSITIVE, Range, check_value

        check_value("last", last, POSITIVE)
        check_value("max_span", max_span, Range(0.0, 1.0))
        rd = RunDir(resolve_run_dir(run_dir))
        if ctx.args:
            if not inputs:
                raise NmtError(f"unexpected argument(s) {' '.join(ctx.args)}; list checkpoint files after --inputs")
            inputs = [*inputs, *map(Path, ctx.args)]
        if (last is None) == (not inputs):
            raise NmtError("say which checkpoints to average: --last N (from the run directory) or --inputs A.pt B.pt ..., not both")
        picked = [] if inputs else last_checkpoint_infos(rd.checkpoint_dir, last, kind)
        paths, again = distinct_files(list(inputs)) if inputs else ([c.path for c in picked], [])
        output = output or rd.checkpoint_dir / "checkpoint_avg.pt"
        averaged = average_into(rd, paths, output,
                                warn=lambda message: print(f"nmt average-checkpoints: warning: {message}", file=sys.stderr))
        # Reported after the fact, so that a refusal stays the only line on stderr.
        if again:
            same = "; ".join(f"{name} is {earlier}" for name, earlier in again)
            print(f"nmt average-checkpoints: note: one file under two names counts once ({same})", file=sys.stderr)
        updates = ", ".join(str(u) for u in averaged["averaged_updates"] if u is not None)
        print(f"averaged {len(paths)} checkpoints ({', '.join(averaged['averaged_from'])}"
              + (f"; updates {updates}" if updates else "") + f") into {output}", file=sys.stderr)
        warning = span_warning([c.update for c in picked] if picked else averaged["averaged_updates"], max_span)
        if warning:
            print(warning, file=sys.stderr)
