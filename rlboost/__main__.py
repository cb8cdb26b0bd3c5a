"""`python -m rlboost`: the `rlboost` command."""

from rlboost.cli import command

if __name__ == "__main__":
    command()
