"""Middleware for `benchmarks/instructions.py --middleware`: the cost of the hook itself."""


class PassThrough:
    """Runs each attempt and does nothing else."""

    def execute(self, job, call_next):
        return call_next()
