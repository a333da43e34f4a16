"""Placeholder while `eqsched rules` is built (replaced by its owner)."""


def add_parser(sub) -> None:
    def run(args) -> int:
        from .cli import CliError

        raise CliError("eqsched rules is not built yet")

    sub.add_parser("rules", help="(being built)").set_defaults(run=run)
