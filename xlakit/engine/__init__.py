"""The lazy executor, a sync's pipeline: cut -> plan (stages) -> key (keys)
-> cache (cache) -> executable (lowerings' to_jax) -> run (executor) ->
StepRecord (records), and the in-graph checks read back (check_results).

Imports: core, lowerings, analysis. No torch tensor subclass, no dispatcher.
"""
