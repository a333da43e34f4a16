"""The schedule space as an e-graph: language, encoding, saturation, and the space object.

See docs/ARCHITECTURE.md §4 The e-graph.
"""
