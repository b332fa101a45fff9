"""The errors a model provider raises, so an agent loop can tell retry from stop.

::

    ProviderError (a ledgerflow PipelineError; ``retryable``, ``usage``, ``raw``)
    ├─ RateLimited          (``retry_after`` seconds, retryable)
    ├─ ModelTimeout         (no answer in time, retryable; the call may still be billed)
    └─ MalformedResponse    (the answer cannot be parsed, e.g. tool arguments that are not JSON)
       └─ DeterministicFailure (from a deterministic model: a retry would repeat it; not retried)
    ModelNotFoundError      (a PluginError: no installed provider has that name)

What governance refuses inside a task, each a ledgerflow ``NonRetryableError`` (the
task fails at once, after a notice says why)::

    GovernanceError
    ├─ ToolNotAllowed       (a tool not on the allowlist, or it touched what it may not)
    │  └─ PathNotAllowed    (a path outside the tool's declared roots)
    ├─ BudgetExceeded       (a reservation does not fit the task's, run's or key's budget)
    ├─ StepsExceeded        (the agent used max_steps model calls without a final answer)
    └─ OutputInvalid        (the final answer did not match ``output=`` after the corrections)
    NotAPrompt              (a DefinitionError: the task's function returned no prompt)

``usage`` is what the provider says (or the mock scripts) was spent before the
failure, when known: a budget settles a failed call to it, or keeps the whole
reservation when it is ``None``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ledgerflow.errors import DefinitionError, NonRetryableError, PipelineError, PluginError

if TYPE_CHECKING:
    from .provider import Usage

__all__ = ["BudgetExceeded", "DeterministicFailure", "GovernanceError", "MalformedResponse",
           "ModelNotFoundError", "ModelTimeout", "NotAPrompt", "OutputInvalid", "PathNotAllowed",
           "ProviderError", "RateLimited", "StepsExceeded", "ToolNotAllowed"]


class ProviderError(PipelineError):
    """A model call failed; ``retryable`` says whether the same call may succeed.

    Attributes:
        retryable: True for transient failures (5xx, connection reset, 429,
            timeouts); False for requests the provider will always refuse.
        usage: tokens the provider billed for the failed call, when known.
        raw: the raw response body, when there was one.
        status: the HTTP status, for HTTP providers.
    """

    default_hint = "check the provider's settings and the request"
    retryable_default = False

    def __init__(self, message: str, *, hint: str | None = None, retryable: bool | None = None,
                 usage: Usage | None = None, raw: bytes | None = None,
                 status: int | None = None) -> None:
        super().__init__(message, hint=hint)
        self.retryable = self.retryable_default if retryable is None else retryable
        self.usage = usage
        self.raw = raw
        self.status = status


class RateLimited(ProviderError):
    """The provider refused the call for now (HTTP 429); wait ``retry_after`` seconds."""

    default_hint = "wait retry_after seconds, or lower the request rate of this key"
    retryable_default = True

    def __init__(self, message: str, *, retry_after: float | None, hint: str | None = None,
                 usage: Usage | None = None, raw: bytes | None = None,
                 status: int | None = 429) -> None:
        super().__init__(message, hint=hint, retryable=True, usage=usage, raw=raw, status=status)
        self.retry_after = retry_after


class ModelTimeout(ProviderError):
    """No complete answer arrived within the caller's timeout.

    The provider may still have done (and billed) the work: ``late`` is True
    when the answer is known to come after the deadline (the mock's ``late``
    fault), and ``usage`` then holds what it will bill.
    """

    default_hint = "raise the call's timeout, or retry"
    retryable_default = True

    def __init__(self, message: str, *, timeout: float | None, late: bool = False,
                 hint: str | None = None, usage: Usage | None = None) -> None:
        super().__init__(message, hint=hint, retryable=True, usage=usage)
        self.timeout = timeout
        self.late = late


class MalformedResponse(ProviderError):
    """The answer arrived but is unusable: not JSON, or a tool call with bad arguments.

    Retryable by default (a sampled model may do better; the spend is real
    either way, see ``usage``).
    """

    default_hint = "retry, or tell the model its last answer was not valid"
    retryable_default = True


class DeterministicFailure(MalformedResponse, NonRetryableError):
    """An unusable answer from a deterministic model (temperature 0): the same request
    gives the same answer, so it is not retried as it was (an agent loop may send the
    error back to the model instead, which changes the request)."""

    default_hint = ("tell the model what was wrong (an agent task does, within corrections=), "
                    "or use a temperature above 0")
    retryable_default = False


class NotAPrompt(DefinitionError, NonRetryableError):
    """An agent task's function returned something that is not a prompt: not retried."""


class ModelNotFoundError(PluginError):
    """No installed plugin provides a model provider of that name."""


class GovernanceError(NonRetryableError):
    """A governed call was refused: the task fails without a retry (a notice says why).

    Attributes:
        kind: the notice kind recorded with it (``tool_not_allowed`` ...).
        hint: one line on how to fix it.
    """

    kind = "governance"
    default_hint = ""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = self.default_hint if hint is None else hint


class ToolNotAllowed(GovernanceError):
    """The model called a tool that is not allowed, or a tool did what it may not."""

    kind = "tool_not_allowed"
    default_hint = "add the tool to tools=[...] (or its permissions) if it is meant to be used"


class PathNotAllowed(ToolNotAllowed):
    """A tool was asked to touch (or touched) a path outside its declared roots."""

    kind = "path_not_allowed"
    default_hint = "declare the folder in the tool's reads=[...] or writes=[...]"


class BudgetExceeded(GovernanceError):
    """The worst case of the next call does not fit a budget (nothing was spent on it)."""

    kind = "budget_exceeded"
    default_hint = "raise the budget, or lower max_output_tokens / max_steps"


class StepsExceeded(GovernanceError):
    """The agent made ``max_steps`` model calls without giving a final answer."""

    kind = "steps_exceeded"
    default_hint = "raise max_steps, or make the task easier to answer"


class OutputInvalid(GovernanceError):
    """The final answer did not match the task's ``output=`` type, corrections used up."""

    kind = "output_invalid"
    default_hint = "raise corrections=, describe the answer's fields in the prompt, or loosen output="
