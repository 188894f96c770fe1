"""%%xla_step and %xla_history."""
from __future__ import annotations

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from .. import api
from ..record import StepRecord
from .views import HistoryView, StepView

# (cell name, record) for every step run under %%xla_step, oldest first
HISTORY: list[tuple[str, StepRecord]] = []


@magics_class
class XlaMagics(Magics):
    @magic_arguments()
    @argument("--name", help="name for this cell's steps (default: the cell number)")
    @argument("--hlo", action="store_true", help="show the HLO of each executable")
    @argument("--quiet", action="store_true", help="record, but show nothing")
    @cell_magic
    def xla_step(self, line, cell):
        """Run the cell, then a step marker; show one view per step the cell produced."""
        args = parse_argstring(self.xla_step, line)
        name = args.name or f"cell {self.shell.execution_count}"
        last = api.last_step()
        before = last.index if last is not None else -1
        filename = self.shell.compile.cache(cell, self.shell.execution_count)
        try:
            exec(self.shell.compile(cell, filename, "exec"), self.shell.user_ns)
            api.mark_step()
        finally:
            # on an error, what ran so far is still shown; the error then propagates
            for record in [r for r in api.steps() if r.index > before]:
                previous = next((r for n, r in reversed(HISTORY) if n == name), None)
                HISTORY.append((name, record))
                if not args.quiet:
                    display(StepView(record, name, previous, args.hlo))

    @magic_arguments()
    @argument("--clear", action="store_true", help="forget the history")
    @line_magic
    def xla_history(self, line):
        """Table of all %%xla_step steps so far, with compile vs execute time per step."""
        args = parse_argstring(self.xla_history, line)
        if args.clear:
            HISTORY.clear()
        else:
            display(HistoryView(HISTORY))
