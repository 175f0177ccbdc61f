"""Every refusal of ``kvtrim serve`` as an ``ApiError``: OpenAI's error shape,
an HTTP status and the ``kind`` label it is counted under in
``kvtrim_errors_total``. Plain functions, no app needed to test them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import (
    Cancelled,
    ConfigError,
    ContextOverflowError,
    KvtrimError,
    OutOfMemoryError,
    TemplateError,
)
from .runner import Overloaded, ShuttingDown
from .schemas import error_body

INVALID = "invalid_request_error"
HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
}


class ApiError(Exception):
    """An error to return in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str,
        code: str | None = None,
        param: str | None = None,
        metric: str = "invalid_request",
    ) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param
        self.metric = metric  # the ``kind`` label of kvtrim_errors_total

    def body(self) -> dict[str, Any]:
        """The JSON body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(str(self), self.kind, self.code, self.param)


def invalid(
    message: str, param: str | None = None, code: str | None = None, metric: str | None = None
) -> ApiError:
    """A 400 for a request the server will not run."""
    return ApiError(400, message, INVALID, code, param, metric or "invalid_request")


def from_engine(exc: BaseException) -> ApiError:
    """An engine error as an HTTP error in OpenAI's shape."""
    if isinstance(exc, Overloaded):
        return ApiError(429, str(exc), "rate_limit_error", "queue_full", metric="overloaded")
    if isinstance(exc, ShuttingDown):
        return ApiError(503, str(exc), "server_error", "server_shutdown", metric="shutdown")
    if isinstance(exc, ContextOverflowError):
        code = "context_length_exceeded"
        return ApiError(400, str(exc), INVALID, code, metric=code)
    if isinstance(exc, OutOfMemoryError):
        message = f"{exc}; try a smaller kv_budget"
        return ApiError(503, message, "server_error", "out_of_memory", metric="out_of_memory")
    if isinstance(exc, ConfigError):
        return invalid(str(exc), code="invalid_value")
    if isinstance(exc, Cancelled):  # stopped by the server (shutting down), not the client
        return ApiError(503, str(exc), "server_error", "request_cancelled", metric="shutdown")
    if isinstance(exc, TemplateError):
        code = "model_template_error"
        return ApiError(500, str(exc), "server_error", code, metric="template")
    if isinstance(exc, KvtrimError):
        return ApiError(500, str(exc), "server_error", "engine_error", metric="engine")
    message = f"internal error: {exc}"
    return ApiError(500, message, "server_error", "internal_error", metric="internal")


def from_http(status: int, detail: str) -> ApiError:
    """Starlette's own errors (unknown path, wrong method, unparsable or too large body)."""
    kind = INVALID if status < 500 else "server_error"
    code = HTTP_CODES.get(status, "invalid_body")
    return ApiError(status, detail, kind, code, metric="invalid_request" if status == 400 else code)


def from_validation(errors: Sequence[Mapping[str, Any]]) -> ApiError:
    """pydantic's errors for a body (``RequestValidationError.errors()``): the first
    names the field (``param``); a body that is no JSON object names none."""
    first = errors[0] if errors else {}
    where = ".".join(str(p) for p in first.get("loc", ())[1:])
    if first.get("type") == "json_invalid" or not where:
        message = "We could not parse the JSON body of your request (send a JSON object)."
        return invalid(message, where or None, "json_invalid")
    return invalid(f"{where}: {first.get('msg', 'invalid value')}", where, "invalid_value")
