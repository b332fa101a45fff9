"""Example tasks for docs/drafts.md: numbers, a file written and read, an agent, a gate."""

from __future__ import annotations

from ledgerflow import task
from ledgerflow.specs.policy import needs


@task
def load(rows: int) -> list[int]:
    """Make the numbers 1..rows."""
    return list(range(1, rows + 1))


@task
def double(x: int) -> int:
    """Double one number."""
    return 2 * x


@task
def total(values: list[int]) -> int:
    """Add numbers up."""
    return sum(values)


@needs(writes=["{path}"])
@task
def save(value: int, path: str) -> str:
    """Write a number to a file."""
    with open(path, "w") as fh:
        fh.write(str(value))
    return path


@needs(reads=["{path}"])
@task
def show(path: str) -> str:
    """Read a file back."""
    with open(path) as fh:
        return fh.read()


@needs(tools=["shell"], network=True)
@task
def ask_agent(question: str) -> str:
    """An agent that may run shell commands."""
    return "42"


@task(approve=True)
def publish(value: int) -> str:
    """Publish a number (a person approves it first)."""
    return f"published {value}"
