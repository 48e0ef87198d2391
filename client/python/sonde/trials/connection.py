"""One gRPC channel to a collector's Query service, and the one place where
gRPC failures become sonde.exceptions errors.

Security mirrors the C++ clients (common/channel.h): plaintext, or TLS with
the CA to trust (plus a client certificate and key for mutual TLS), and a
bearer token sent as `authorization: Bearer <token>` metadata on every call
(as metadata rather than call credentials, which gRPC only sends over TLS:
a token over plaintext loopback is a valid set-up). Thread-safe.
"""

import os

import grpc

from sonde.exceptions import CollectorUnavailable, JobNotFound, QueryError
from sonde.v1 import query_pb2_grpc

# Largest message accepted from the collector (a WatchSteps step lists every
# tensor's statistics; chunks are at most the collector's piece size).
MAX_RECEIVE_BYTES = 64 << 20

# Steps or points asked for per ListSteps or ReadSeries call; the trial
# reads on while the collector says more follow (it also cuts at ~3 MiB).
PAGE_SIZE = 100000


def next_page_start(what, job, items, start, global_steps):
    """Where the page after a cut one starts: past its last step (a global
    or a mode step). A cut page that holds nothing past `start` is an error,
    not a short answer: asking again would loop."""
    if items:
        last = items[-1].step if global_steps else items[-1].mode_step
        if last >= start:
            return last + 1
    raise QueryError("the collector cut its answer of {} of job '{}' from step {} without "
                     "going past it".format(what, job, start))


def _pem(value, what):
    """PEM bytes as given, or read from a path."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    path = os.fspath(value)
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError("cannot read the {} file '{}': {}".format(what, path, e.strerror)) from e


class Connection:
    def __init__(self, address, token=None, root_certificates=None, certificate_chain=None,
                 private_key=None, server_name=None, timeout=30.0):
        if not isinstance(address, str) or not address:
            raise ValueError("the collector address must be 'host:port', got {!r}".format(address))
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("a client certificate needs both certificate_chain and private_key")
        if certificate_chain is not None and root_certificates is None:
            raise ValueError("a client certificate is only used with TLS: "
                             "give root_certificates (the CA to trust) too")
        if token is not None and ("\r" in token or "\n" in token):
            raise ValueError("the token contains a line break")
        self.address = address
        self.timeout = timeout
        self._metadata = (("authorization", "Bearer " + token),) if token else ()
        options = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        if root_certificates is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(root_certificates, "CA certificate"),
                private_key=_pem(private_key, "client key"),
                certificate_chain=_pem(certificate_chain, "client certificate"))
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self._channel = grpc.secure_channel(address, credentials, options=options)
        self._stub = query_pb2_grpc.QueryStub(self._channel)

    def close(self):
        self._channel.close()

    def call(self, method, request, job=None, timeout=None, wait_for_ready=None):
        """A unary call; QueryError (or a subclass) when it fails."""
        try:
            return getattr(self._stub, method)(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=self._metadata, wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            raise self.error(method, e, job) from None

    def stream(self, method, request, job=None, timeout=None, wait_for_ready=None):
        """A server-streaming call's messages; QueryError when it fails.

        The generator cancels the call when it is closed early.
        """
        call = getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata,
                                           wait_for_ready=wait_for_ready)
        try:
            for message in call:
                yield message
        except grpc.RpcError as e:
            raise self.error(method, e, job) from None
        finally:
            call.cancel()

    def error(self, method, rpc_error, job=None):
        code = rpc_error.code()
        details = rpc_error.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE:
            return CollectorUnavailable(self.address, details)
        if code == grpc.StatusCode.NOT_FOUND and job is not None and method == "GetJob":
            return JobNotFound(job, self.address, details)
        what = "{} of job '{}'".format(method, job) if job else method
        return QueryError("{} on the Sonde collector at {}: {}: {}".format(
            what, self.address, code.name, details), code=code, details=details)
