"""What XLA says about a step, and what a record says read closely: memory,
cost and collectives of a compiled executable, the buffers a step holds,
FLOPs per op and module, why a key missed the cache.

Imports: core. Read by the engine (it fills records) and by the views.
"""
