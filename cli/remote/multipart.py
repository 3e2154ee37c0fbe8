"""A multipart/mixed body (RFC 2046) split into its parts as it arrives, in constant memory: an export with its
decision records comes back from POST /v1/audit/exports as one such answer, and each part is a whole file that
may be larger than memory (the standard library's `email` parser holds the whole message)."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from cli.remote.client import ApiError

MAX_PART_HEADERS = 16 * 1024  # a part's header block: a type and a file name, never more than this


def boundary_of(content_type: str) -> bytes | None:
    """The boundary a `multipart/mixed; boundary=...` Content-Type names; None for any other type."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/mixed":
        return None
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "boundary":
            value = value.strip().strip('"')
            if 0 < len(value) <= 70:  # RFC 2046's bound
                return value.encode("ascii", errors="replace")
    return None


def filename_of(headers: dict[str, str]) -> str | None:
    """The file name a part's Content-Disposition gives (`attachment; filename="x"`), if any."""
    for param in headers.get("content-disposition", "").split(";")[1:]:
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "filename":
            return value.strip().strip('"')
    return None


class MultipartSplitter:
    """Feed it the body's bytes as they come; each part's headers (lower-case names) go to `start`, which returns
    where that part's body is written. ApiError (the server's answer is not what it says) on a malformed body,
    including, at `close()`, one that ends before its closing boundary (an answer cut short)."""

    def __init__(self, boundary: bytes, start: Callable[[dict[str, str]], IO[bytes]]) -> None:
        self._delimiter = b"\r\n--" + boundary
        self._buf = bytearray(b"\r\n")  # the first delimiter has no line break of its own before it
        self._start = start
        self._state = "preamble"  # preamble -> (after -> headers -> body -> after)* -> done
        self._out: IO[bytes] | None = None
        self.parts = 0

    def feed(self, data: bytes) -> None:
        self._buf += data
        while self._step():
            pass

    def close(self) -> None:
        if self._state != "done":
            raise ApiError("the server's multipart answer ends before its closing boundary: it was cut short")

    def _step(self) -> bool:
        """Consume what the buffer allows in the current state; whether to go on."""
        buf, delim = self._buf, self._delimiter
        if self._state in ("preamble", "body"):
            at = buf.find(delim)
            keep = len(delim) - 1 if at < 0 else 0  # a delimiter may begin in the buffer's tail
            upto = at if at >= 0 else max(0, len(buf) - keep)
            if self._state == "body" and upto and self._out is not None:
                self._out.write(bytes(buf[:upto]))
            if at < 0:
                del buf[:upto]
                return False
            del buf[: at + len(delim)]
            self._state, self._out = "after", None
            return True
        if self._state == "after":  # `--` closes the body, a line break begins the next part's headers
            if len(buf) < 2:
                return False
            if buf[:2] == b"--":
                self._state = "done"
            elif buf[:2] == b"\r\n":
                del buf[:2]
                self._state = "headers"
            else:
                raise ApiError("the server's multipart answer has a malformed boundary line")
            return True
        if self._state == "headers":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_PART_HEADERS:
                    raise ApiError("the server's multipart answer has a part without the end of its headers")
                return False
            headers: dict[str, str] = {}
            for line in bytes(buf[:end]).decode("utf-8", errors="replace").split("\r\n"):
                name, sep, value = line.partition(":")
                if not sep:
                    raise ApiError("the server's multipart answer has a malformed part header")
                headers[name.strip().lower()] = value.strip()
            del buf[: end + 4]
            self._out = self._start(headers)
            self.parts += 1
            self._state = "body"
            return True
        buf.clear()  # done: an epilogue, if any, is ignored (RFC 2046)
        return False
