"""Exceptions raised by asyncps: one class per status code of the C++ stack
(common/status.h), all derived from asyncps.Error.

    Error                    base of everything asyncps raises
    InvalidArgument          bad input (wrong dtype/shape/layout, unknown codec
                             spec, bad option): fix the call; also a ValueError
    NotFound                 unknown tensor, chunk, file; also a LookupError
    AlreadyExists            a shard holds a different model (names the tensor)
    FailedPrecondition       not valid now (push before register, store closed,
                             model changed after registration)
    Unavailable              a shard is not reachable now; also a ConnectionError
    TimedOut                 no reply before the deadline (names the endpoint);
                             also a TimeoutError
    ResourceExhausted        a limit was hit (sizes, requests in flight)
    Corruption               damaged bytes (payload, file, reply)
    Cancelled                the wait was interrupted
    Unimplemented            not supported by this build; also NotImplementedError
    Internal                 a bug or an unexpected library failure

The message is the C++ Status message, which names the tensor, shard or
endpoint concerned. A failed call changes no shard state: requests are
validated whole before any of it is sent or applied.
"""


class Error(Exception):
    """Base class of asyncps errors; `code` is the status code number."""
    code = 9


class InvalidArgument(Error, ValueError):
    code = 1


class NotFound(Error, LookupError):
    code = 2


class AlreadyExists(Error):
    code = 3


class FailedPrecondition(Error):
    code = 4


class Unavailable(Error, ConnectionError):
    code = 5


class TimedOut(Error, TimeoutError):
    code = 6


class ResourceExhausted(Error):
    code = 7


class Corruption(Error):
    code = 8


class Internal(Error):
    code = 9


class Cancelled(Error):
    code = 10


class Unimplemented(Error, NotImplementedError):
    code = 11


__all__ = ["Error", "InvalidArgument", "NotFound", "AlreadyExists", "FailedPrecondition",
           "Unavailable", "TimedOut", "ResourceExhausted", "Corruption", "Internal",
           "Cancelled", "Unimplemented"]
