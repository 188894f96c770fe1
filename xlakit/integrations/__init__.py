"""xlakit beside other tools: torch.compile's backend (dynamo; an FX graph run on
lazy tensors: fx_interpreter; its executable run again: compiled_call), PyTorch/XLA's
executor with xlakit's views (torch_xla), the graph-break explorer (breaks),
PyTorch's OpInfo samples run against eager (opinfo).

Imports: core, lowerings, analysis, engine, front, session.
"""
