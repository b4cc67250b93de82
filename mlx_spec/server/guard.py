"""What keeps web pages from driving the server: the `Host` check against DNS rebinding, JSON-only API bodies against
browsers' simple cross-site requests, and CORS only for the origin the server was told to trust."""

from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.requests import Request

from .errors import ERROR, ApiError

LOOPBACK = ("localhost", "127.0.0.1", "::1")  # the names a request to this machine's loopback address carries
ANY_ADDRESS = ("0.0.0.0", "::", "")  # a bind to every interface names no host a request could carry
JSON = "application/json"


def host_name(host: str) -> str:
    """A `Host` header's name without its port, lower case ('[::1]:8080' -> '::1')."""
    host = host.strip().lower()
    if host.startswith("["):  # an IPv6 literal
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def host_names(host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The host names a request may carry: the loopback names, the address bound (unless every interface) and
    `extra` (`--allowed-hosts`; '*' allows any)."""
    names = {*LOOPBACK, *(host_name(h) for h in extra)}
    if host not in ANY_ADDRESS:
        names.add(host_name(host))
    return frozenset(names)


def check_json(request: Request) -> None:
    """A 415 unless the body is declared JSON: a browser sends a cross-site form or text/plain without asking first."""
    declared = request.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != JSON:
        raise ApiError(
            415,
            f"the request body must be JSON sent with 'Content-Type: {JSON}', got {declared or 'no Content-Type'!r}",
            code="unsupported_media_type",
        )


class HostCheck:
    """ASGI middleware: a 403 for a request whose `Host` names no address this server answers to (a DNS-rebinding
    page's request carries its own site's name). `render` shapes the error for the request's path."""

    def __init__(self, app, hosts: frozenset[str], render):
        self.app, self.hosts, self.render = app, hosts, render

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or "*" in self.hosts:
            return await self.app(scope, receive, send)
        host = Headers(scope=scope).get("host", "")
        if host_name(host) in self.hosts:
            return await self.app(scope, receive, send)
        error = ApiError(
            403,
            f"the Host header {host!r} names no address this server answers to; "
            "start it with --allowed-hosts NAME to answer to NAME",
            type="permission_error",
            code="host_not_allowed",
        )
        scope[ERROR] = error
        await self.render(scope.get("path", ""), error)(scope, receive, send)
