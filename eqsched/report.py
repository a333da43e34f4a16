"""Placeholder while `eqsched report` is built (replaced by its owner)."""


def add_parser(sub) -> None:
    def run(args) -> int:
        from .cli import CliError

        raise CliError("eqsched report is not built yet")

    sub.add_parser("report", help="(being built)").set_defaults(run=run)
