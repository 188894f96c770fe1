"""The data every layer passes along: the IR (nodes, graphs, device buffers),
the StepRecord schema, source lines and module paths, in-graph check kinds,
moving arrays between host and device, meshes and placements, and the
reader of an executable's optimized HLO text.

Imports: config, version. Everything imports it.
"""
