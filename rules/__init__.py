"""eqsched.rules: the rewrite rules of the schedule e-graph (installed from the repo's rules/).

Each transformation of the manual schedule API (split/tile, reorder, fuse, inline, vectorize,
unroll, parallel, cache_write, pack) will live here in its pattern form: a small named egglog
ruleset with a before -> after docstring, guarded by the analysis facts of `eqsched.legality`.
Nothing is defined yet; the manual primitives are in `eqsched.schedule`.
"""
