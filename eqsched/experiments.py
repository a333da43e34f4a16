"""Placeholder while `eqsched experiment` is built (replaced by its owner)."""


def add_parser(sub) -> None:
    def run(args) -> int:
        from .cli import CliError

        raise CliError("eqsched experiment is not built yet")

    sub.add_parser("experiment", help="(being built)").set_defaults(run=run)
