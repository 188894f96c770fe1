"""The torch front: the lazy device's tensors, how aten ops on them become IR
(recorder, with op_info, op_shapes and scalar_checks; functionalization's kernels
in torch's dispatcher), and what the device changes in torch for modules,
autocast, torch.save, sharding and labels; install.py puts all of it in place once.

Imports: core, lowerings, analysis, engine.
"""
