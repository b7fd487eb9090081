"""What answers at a Spark address, asked before a session is tried.

Spark's own clients wait a minute or more on a port that answers but is not what they expect:
a standalone master's web UI (``spark://HOST:8080``: the driver retries its registration for
60 s and then says "An error occurred while calling None...."), or a Connect URL whose port is a
web server, or a plaintext Connect server asked through TLS (``;token=`` makes the Connect
client use TLS): it retries for minutes while gRPC writes its handshake errors on the terminal.
Each probe here takes at most a few seconds and returns what is wrong in words, or None.
"""

from __future__ import annotations

import socket
import ssl

_WAIT_S = 3.0
# The first bytes of a Spark RPC frame (an 8-byte length, here 64) and a blank line: a Spark
# master waits for the rest of the frame and closes without a word when the probe stops
# sending; an HTTP server answers the blank-line-terminated request it got, with an error.
_UNFINISHED_FRAME = (64).to_bytes(8, "big") + b"\r\n\r\n"
# What a gRPC client sends first (HTTP/2 with prior knowledge): the preface and an empty
# SETTINGS frame; a gRPC server answers with its own SETTINGS frame (type 4).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def _who(answer: bytes) -> str:
    """The kind of server whose first bytes are ``answer``."""
    if answer.startswith(b"HTTP/"):
        status = answer.split(b"\r\n", 1)[0].decode("latin-1")[:40]
        return f"a web server ({status})"
    if _web_page(answer):
        return "a web server"
    if answer[:1] == b"\x15" and answer[1:2] == b"\x03":
        return "a TLS server"
    if answer.startswith(b"SSH-"):
        return "an SSH server"
    return f"a server that is not Spark (its first bytes: {answer[:12]!r})"


def _web_page(answer: bytes) -> bool:
    return answer.startswith(b"HTTP/") or answer.lstrip()[:1] == b"<"  # HTTP/0.9: a page alone


def _ask(host: str, port: int, greeting: bytes, half_close: bool) -> bytes | None:
    """The peer's first bytes after ``greeting`` (b"" if it closed without a word), None when it
    said nothing within the wait or could not be reached (the caller's own check says that)."""
    try:
        s = socket.create_connection((host, port), timeout=_WAIT_S)
    except OSError:
        return None
    with s:
        try:
            s.sendall(greeting)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            return s.recv(64)
        except TimeoutError:
            return None
        except OSError:  # reset: it closed without reading what was sent
            return b""


def master_port_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` is not a standalone master's RPC port, or None when it behaves as one
    (it takes the start of a frame without a word)."""
    answer = _ask(host, port, _UNFINISHED_FRAME, half_close=True)
    if not answer:
        return None
    hint = (" (a standalone master's web UI answers so; its RPC port, the one to give, is 7077 "
            "unless it was started with --port)" if _web_page(answer) else "")
    return f"{_who(answer)} answers at {host}:{port}, not a Spark master{hint}"


def connect_port_problem(host: str, port: int, tls: bool) -> str | None:
    """Why ``host:port`` is not a Spark Connect server the client can talk to (``tls``: the
    client will use TLS), or None when it greets as a gRPC server does (over TLS when asked)."""
    if tls:
        return _tls_problem(host, port)
    answer = _ask(host, port, _H2_PREFACE, half_close=False)
    if answer is None:
        return f"nothing answers a gRPC client's greeting at {host}:{port} within {_WAIT_S:.0f} s"
    if len(answer) >= 4 and answer[3] == 0x04:  # a SETTINGS frame: HTTP/2, as gRPC speaks
        return None
    if not answer:
        return f"the server at {host}:{port} closed the connection at a gRPC client's greeting"
    if answer[:1] == b"\x15":
        return (f"a TLS server answers at {host}:{port}; add ;use_ssl=true to the URL for a "
                "server behind TLS")
    return f"{_who(answer)} answers at {host}:{port}, not a Spark Connect (gRPC) server"


_USES_TLS = ("the URL has the Connect client use TLS (;use_ssl=true, or ;token= to any host but "
             "localhost)")


def _tls_problem(host: str, port: int) -> str | None:
    context = ssl.create_default_context()
    context.check_hostname = False  # the client checks the certificate; here only the protocol
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=_WAIT_S) as raw, \
                context.wrap_socket(raw, server_hostname=host):
            return None
    except ssl.SSLError as e:
        return (f"the server at {host}:{port} does not speak TLS ({e.reason or e}), and "
                f"{_USES_TLS}; put the server behind TLS or leave those out")
    except (TimeoutError, OSError):
        return (f"the server at {host}:{port} did not finish a TLS greeting within "
                f"{_WAIT_S:.0f} s, and {_USES_TLS}")
