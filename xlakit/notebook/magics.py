"""%%xla_step and %xla_history."""
from __future__ import annotations

import collections
import contextlib
import sys

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .. import session
from ..analysis import budget
from ..config import config
from ..core.record import Backend, StepRecord
from ..core.state import PROCESS
from .history_plot import HistoryPlot
from .views import HistoryView, StepView

# (cell name, record) for the steps run under %%xla_step, oldest first: the newest
# config.record_limit, like the log the records come from, as it is when each step is kept
# (a deque's maxlen, fixed at import, kept 120 after a later record_limit of 50)
HISTORY: collections.deque[tuple[str, StepRecord]] = PROCESS.keep(
    "notebook.magics: %xla_history", collections.deque(), bound="config.record_limit",
    why="%xla_history lists the steps %%xla_step ran")


def _keep(name: str, record: StepRecord) -> None:
    HISTORY.append((name, record))
    while len(HISTORY) > max(config.record_limit, 0):
        HISTORY.popleft()


@contextlib.contextmanager
def _numerics(nans: bool, ranges: bool):
    """config.check_nans and config.record_ranges on for one cell where its flags ask (a setting
    already on stays). Only what the flags turned on is turned off again: a setting the cell's own
    code makes outlives the cell, as it would without the magic."""
    asked = [name for name, flag in (("check_nans", nans), ("record_ranges", ranges)) if flag]
    turned_on = [name for name in asked if not getattr(config, name)]
    for name in turned_on:
        setattr(config, name, True)
    try:
        yield
    finally:
        for name in turned_on:
            if getattr(config, name) is True:  # else the cell set it: its value stays
                setattr(config, name, False)


@magics_class
class XlaMagics(Magics):
    @magic_arguments()
    @argument("--name", help="name for this cell's steps (default: the cell number)")
    @argument("--hlo", action="store_true", help="show the HLO of each executable")
    @argument("--quiet", action="store_true", help="record, but show nothing")
    @argument("--profile", action="store_true",
              help="measure each step's executable with JAX's profiler (a Profile tab: time per module, line, op)")
    @argument("--max-compiles", type=int, default=None, metavar="N",
              help="warn (config.strict_recompiles: raise) when one run of this cell compiles more than N "
                   "times after its first step")
    @argument("--profile-runs", type=int, default=1, metavar="N",
              help="with --profile: run each executable N times and keep the median (default 1)")
    @argument("--backend", choices=list(Backend), default=Backend.XLAKIT,
              help="whose executor: xlakit's, or the real torch_xla's")
    @argument("--nans", action="store_true",
              help="find the op that made the first NaN or infinity, and raise there (config.check_nans)")
    @argument("--ranges", action="store_true",
              help="record each module's largest value against its dtype's limit (config.record_ranges)")
    @cell_magic
    def xla_step(self, line, cell):
        """Run the cell, then a step marker; show one view per step the cell produced."""
        args = parse_argstring(self.xla_step, line)
        name = args.name or f"cell {self._cell_number()}"
        run = self._run_torch_xla if args.backend == Backend.TORCH_XLA else self._run_xlakit
        records = []
        try:
            with (session.profile(args.profile_runs) if args.profile else session.capture()) as records, \
                    _numerics(args.nans, args.ranges):
                run(cell)
        finally:
            # on an error, what ran so far is still shown; the error then propagates
            for record in records:
                previous = next((r for n, r in reversed(HISTORY)
                                 if n == name and r.backend == record.backend), None)
                _keep(name, record)
                if not args.quiet:
                    display(StepView(record, name, previous, args.hlo))
        if args.max_compiles is not None:
            # this run's steps: a cell fixed after a recompile storm is within its budget again
            over = budget.over_budget(f"cell {name!r}", budget.recompiles(records), args.max_compiles,
                                      f"--max-compiles {args.max_compiles}")
            if over is not None:
                budget.enforce(over)

    def _cell_number(self) -> int:
        """The running cell's number, [N] on the page: the number IPython gave the
        code that called this magic. (ipykernel has counted the next cell in
        `execution_count` already; a plain IPython shell has not.)"""
        numbers = self.shell.compile._filename_map
        frame = sys._getframe(1)
        while frame is not None:
            number = numbers.get(frame.f_code.co_filename)
            if number is not None:
                return number
            frame = frame.f_back
        return self.shell.execution_count

    def _exec(self, cell: str) -> None:
        # IPython's transforms (%magic, !cmd, obj?) as a plain cell gets them; they drop
        # leading blank lines, put back so each line keeps its number in the cell
        blank = cell[:len(cell) - len(cell.lstrip())].count("\n")
        code = "\n" * blank + self.shell.transform_cell(cell)
        filename = self.shell.compile.cache(code, self._cell_number())
        exec(self.shell.compile(code, filename, "exec"), self.shell.user_ns)

    def _run_xlakit(self, cell: str) -> None:
        self._exec(cell)
        session.mark_step()

    def _run_torch_xla(self, cell: str) -> None:
        from ..integrations import torch_xla as adapter

        before = adapter.execution_count()
        self._exec(cell)
        adapter.step(implicit_executions=adapter.execution_count() - before)  # its record goes to the log

    @magic_arguments()
    @argument("--clear", action="store_true", help="forget the history")
    @argument("--plot", action="store_true",
              help="draw it: per step Python, compile and execute time, the compiles, the peak memory")
    @line_magic
    def xla_history(self, line):
        """Table of all %%xla_step steps so far, with compile vs execute time per step."""
        args = parse_argstring(self.xla_history, line)
        if args.clear:
            HISTORY.clear()
        elif args.plot:
            display(HistoryPlot(HISTORY))
        else:
            display(HistoryView(HISTORY))
