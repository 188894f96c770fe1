"""xlakit beside other tools: torch.compile's backend (dynamo), PyTorch/XLA's
executor with xlakit's views (torch_xla), the graph-break explorer (breaks),
PyTorch's OpInfo samples run against eager (opinfo).

Imports: core, lowerings, analysis, engine, front, session.
"""
