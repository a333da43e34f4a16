"""eqsched.extract: cost models and extractors (installed from the repo's extract/).

This is where programs will be chosen from the saturated e-graph: a walk over the serialized
e-graph that picks one node per class and a size for every tile symbol, cost models that score
whole concrete programs, top-k search, and a model learned from measurements. Nothing is defined
yet; programs are measured with `eqsched.runner.measure`.
"""
