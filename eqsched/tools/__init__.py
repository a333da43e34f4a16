"""Research tools on top of eqsched's public API: batch suites, HTML reports, the rule kit and
the space experiments. Each tool module adds its subcommand to `eqsched` with `add_parser(sub)`.

See docs/ARCHITECTURE.md §14 Layering.
"""
