"""The schedule space as an e-graph: language, encoding, saturation, and the space object."""
