"""The one exception type a user sees for bad input: it names the file and the problem."""


class EaglenestError(Exception):
    """Bad input or a broken contract between stages.

    Raised with a message that says which file is at fault and what is wrong with it, so the
    workflow's log tells the user what to fix without a traceback hunt.
    """

    def __init__(self, problem: str, path=None):
        self.path = None if path is None else str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)
