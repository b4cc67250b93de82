"""OpenAI-style API errors: one exception type, rendered as `{"error": {message, type, param, code}}`."""

from collections.abc import Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse


class ApiError(Exception):
    """A request the server answers with an HTTP error status and an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400 for input the client can fix."""
    return ApiError(400, message, param=param, code=code)


ERROR = "mlx_spec.error"  # the request scope's key for the ApiError it was answered with: the log line tells it


async def handle(request: Request, exc: ApiError) -> JSONResponse:
    """Starlette exception handler for ApiError."""
    request.scope[ERROR] = exc
    return exc.response()
