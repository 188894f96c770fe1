"""The notebook views: StepRecords and break reports as text, static HTML and
widgets, and the IPython extension (`%load_ext xlakit` registers %%xla_step
and %xla_history).

Imports: core, analysis, session, integrations. Views read records; they
never reach into the engine, the lowerings or the torch front.
"""
from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from .magics import XlaMagics

    ipython.register_magics(XlaMagics)
