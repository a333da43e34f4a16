"""Placeholder while `eqsched batch` is built (replaced by its owner)."""


def add_parser(sub) -> None:
    def run(args) -> int:
        from .cli import CliError

        raise CliError("eqsched batch is not built yet")

    sub.add_parser("batch", help="(being built)").set_defaults(run=run)
