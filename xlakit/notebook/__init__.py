"""IPython extension: `%load_ext xlakit` registers %%xla_step and %xla_history."""
from __future__ import annotations


def load_ipython_extension(ipython) -> None:
    from .magics import XlaMagics

    ipython.register_magics(XlaMagics)
