#!/usr/bin/env python3
"""Keel identity signer: turns the user an authenticating proxy vouched for into a short-lived
HS256 JWT that a Keel runtime in remote mode accepts in `X-Keel-Identity`.

nginx calls it with `auth_request` for every request to a runtime. It reads the user from the
authenticating proxy's headers (oauth2-proxy: `X-Auth-Request-User`, `X-Auth-Request-Email`,
`X-Auth-Request-Preferred-Username`, `X-Auth-Request-Groups`), maps the user to an org (the Keel
workspace) and a role (`member` unless the mapping or one of the user's groups makes them an
`operator` of their org, or the deployment's own `runtime_operator`), and answers
200 with the token in the `X-Keel-Identity` response header; 401 when no user is present, 403
when the user has no org. It trusts those headers: whatever can connect to it can name any user
and get their identity. So it must answer nginx only, and nginx must set the headers itself
(see deploy/proxy/nginx.conf). The compose example listens on a Unix socket
(`SIGNER_LISTEN=unix:/run/keel-signer-a/signer.sock`) in a volume that only nginx and this
signer mount, and runs it with no network at all; a TCP address is reachable by every process
that can reach the address (on loopback: every process of the host, and every container of
the host's network).

Standard library only. Settings (environment):
  KEEL_RUNTIME_ID         required: the token's `aud`, the runtime's KEEL_RUNTIME_ID
  KEEL_REMOTE_JWT_SECRET  required, 32+ characters: the runtime's KEEL_REMOTE_JWT_SECRET
  SIGNER_LISTEN           `unix:/absolute/path` (a Unix socket) or IPv4 `host:port`;
                          default 127.0.0.1:8088
  SIGNER_SOCKET_MODE      the Unix socket's permissions, octal, default 0660 (owner and group)
  SIGNER_SOCKET_GROUP     the Unix socket's group, a name or a number (nginx's, so its workers
                          may connect); unset: the signer's own group
  SIGNER_ORGS_FILE        JSON mapping of users to orgs (see README.md)
  SIGNER_DEFAULT_ORG      the org of users the mapping does not name (unset: they get 403)
  SIGNER_TTL_SECONDS      token lifetime, default 60, at most 300 (Keel's limit)
  SIGNER_KID              optional `kid` header, for a runtime that picks keys by id
  SIGNER_USER_HEADER      default X-Auth-Request-User
  SIGNER_EMAIL_HEADER     default X-Auth-Request-Email
  SIGNER_NAME_HEADER      default X-Auth-Request-Preferred-Username
  SIGNER_GROUPS_HEADER    default X-Auth-Request-Groups (a comma list, as oauth2-proxy sends it)
  SIGNER_OPERATOR_GROUPS  comma list of groups whose users are operators (unset: none)
  SIGNER_RUNTIME_OPERATOR_GROUPS
                          comma list of groups whose users are the runtime's operators, who
                          may name its secrets and hosts in any org (unset: none)

`signer.py --healthcheck` asks the signer at SIGNER_LISTEN for /healthz and exits 0 when it
answers 200, 1 otherwise (the compose health check: a signer on a socket has no port to probe).
"""

import base64
import grp
import hashlib
import hmac
import json
import os
import signal
import socket
import socketserver
import stat
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_TTL_SECONDS = 300
MIN_SECRET_LENGTH = 32
# Header values longer than this are not an identity; refuse rather than sign them.
MAX_VALUE_LENGTH = 256
# A groups header carries many names; longer than this, it is ignored (no group counts).
MAX_GROUPS_LENGTH = 8192
ROLES = ("member", "operator", "runtime_operator")
DEFAULT_LISTEN = "127.0.0.1:8088"
UNIX_PREFIX = "unix:"


class ConfigError(Exception):
    pass


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def sign_hs256(claims, secret, kid=None):
    header = {"alg": "HS256", "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing_input = ".".join(
        b64url(json.dumps(part, separators=(",", ":")).encode("utf-8"))
        for part in (header, claims)
    )
    signature = hmac.new(secret, signing_input.encode("ascii"), hashlib.sha256).digest()
    return signing_input + "." + b64url(signature)


def load_orgs(path):
    """The mapping file: keys are a user, an email or `@domain`; values an org name or an
    object with `org` and optional `project`, `name` and `role` (`member`, `operator` or
    `runtime_operator`)."""
    if not path:
        return {}
    with open(path, encoding="utf-8") as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict):
        raise ConfigError(f"{path}: expected a JSON object of user -> org")
    entries = {}
    for key, value in mapping.items():
        entry = {"org": value} if isinstance(value, str) else value
        if not isinstance(entry, dict) or not isinstance(entry.get("org"), str):
            raise ConfigError(f"{path}: {key!r} has no org")
        if entry.get("role", "member") not in ROLES:
            raise ConfigError(f"{path}: {key!r} has role {entry['role']!r}, not one of {ROLES}")
        entries[key.lower()] = entry
    return entries


def parse_listen(value):
    """`unix:/absolute/path` -> the path (a str); `host:port` -> (host, port)."""
    if value.startswith(UNIX_PREFIX):
        path = value[len(UNIX_PREFIX) :]
        if not os.path.isabs(path):
            raise ConfigError(f"SIGNER_LISTEN {value!r}: a Unix socket needs an absolute path")
        return path
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ConfigError(f"SIGNER_LISTEN {value!r}: expected unix:/path or host:port")
    return (host, int(port))


def parse_mode(value):
    try:
        mode = int(value, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ConfigError(f"SIGNER_SOCKET_MODE {value!r}: expected octal permissions, e.g. 0660")
    return mode


def parse_group(value):
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        return grp.getgrnam(value).gr_gid
    except KeyError:
        raise ConfigError(f"SIGNER_SOCKET_GROUP {value!r}: no such group") from None


class Config:
    def __init__(self, env):
        self.runtime_id = env.get("KEEL_RUNTIME_ID", "")
        if not self.runtime_id:
            raise ConfigError("KEEL_RUNTIME_ID is required (the token's audience)")
        secret = env.get("KEEL_REMOTE_JWT_SECRET", "")
        if len(secret) < MIN_SECRET_LENGTH:
            raise ConfigError(
                f"KEEL_REMOTE_JWT_SECRET must be at least {MIN_SECRET_LENGTH} characters "
                "(generate one with `openssl rand -hex 32`)"
            )
        self.secret = secret.encode("utf-8")
        self.listen = parse_listen(env.get("SIGNER_LISTEN") or DEFAULT_LISTEN)
        self.socket_mode = parse_mode(env.get("SIGNER_SOCKET_MODE") or "0660")
        self.socket_group = parse_group(env.get("SIGNER_SOCKET_GROUP") or None)
        self.orgs = load_orgs(env.get("SIGNER_ORGS_FILE"))
        self.default_org = env.get("SIGNER_DEFAULT_ORG") or None
        self.ttl = int(env.get("SIGNER_TTL_SECONDS", "60"))
        if not 0 < self.ttl <= MAX_TTL_SECONDS:
            raise ConfigError(f"SIGNER_TTL_SECONDS must be 1..{MAX_TTL_SECONDS}")
        self.kid = env.get("SIGNER_KID") or None
        self.user_header = env.get("SIGNER_USER_HEADER", "X-Auth-Request-User")
        self.email_header = env.get("SIGNER_EMAIL_HEADER", "X-Auth-Request-Email")
        self.name_header = env.get(
            "SIGNER_NAME_HEADER", "X-Auth-Request-Preferred-Username"
        )
        self.groups_header = env.get("SIGNER_GROUPS_HEADER", "X-Auth-Request-Groups")
        self.operator_groups = set(split_list(env.get("SIGNER_OPERATOR_GROUPS", "")))
        self.runtime_operator_groups = set(
            split_list(env.get("SIGNER_RUNTIME_OPERATOR_GROUPS", ""))
        )

    def org_of(self, user, email):
        """The most specific mapping wins: email, then user, then the email's domain."""
        candidates = [email, user]
        if email and "@" in email:
            candidates.append("@" + email.rsplit("@", 1)[1])
        for key in candidates:
            if key and key.lower() in self.orgs:
                return self.orgs[key.lower()]
        return {"org": self.default_org} if self.default_org else None

    def role_of(self, entry, groups):
        """The highest role the mapping entry or one of the user's groups gives:
        `runtime_operator` (the deployment's own), then `operator` (of the org); else
        `member`, Keel's default, which the token states anyway."""
        groups = set(groups)
        if entry.get("role") == "runtime_operator" or self.runtime_operator_groups & groups:
            return "runtime_operator"
        if entry.get("role") == "operator" or self.operator_groups & groups:
            return "operator"
        return "member"

    def claims(self, user, email, display_name, now, groups=()):
        entry = self.org_of(user, email)
        if entry is None:
            return None
        claims = {
            "sub": user,
            "org": entry["org"],
            "role": self.role_of(entry, groups),
            "aud": self.runtime_id,
            "iat": now,
            "nbf": now,
            "exp": now + self.ttl,
        }
        name = entry.get("name") or display_name or email
        if name:
            claims["name"] = name
        if entry.get("project"):
            claims["project"] = entry["project"]
        return claims


def header_value(headers, name, limit=MAX_VALUE_LENGTH):
    value = (headers.get(name) or "").strip()
    if len(value) > limit or any(ord(c) < 0x20 for c in value):
        return ""
    return value


def split_list(value):
    return [part.strip() for part in value.split(",") if part.strip()]


class Handler(BaseHTTPRequestHandler):
    config = None  # set by serve()
    server_version = "keel-signer"
    sys_version = ""

    def answer(self):
        if self.path == "/healthz":
            return self.reply(200)
        user = header_value(self.headers, self.config.user_header)
        email = header_value(self.headers, self.config.email_header)
        if not user:
            return self.reply(401)
        display_name = header_value(self.headers, self.config.name_header)
        groups = split_list(
            header_value(self.headers, self.config.groups_header, MAX_GROUPS_LENGTH)
        )
        claims = self.config.claims(user, email, display_name, int(time.time()), groups)
        if claims is None:
            return self.reply(403)
        token = sign_hs256(claims, self.config.secret, self.config.kid)
        return self.reply(200, {"X-Keel-Identity": token})

    # auth_request subrequests keep the client's method; every method is the same question.
    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = answer

    def reply(self, status, headers=None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()

    def log_message(self, format, *args):
        # The request line and status only: never a header, so never a token.
        sys.stderr.write("signer: %s\n" % (format % args))


class UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    """HTTP on a Unix socket: what can open the socket's directory and write the socket may
    ask, nothing else (no address to reach over a network)."""

    daemon_threads = True


def bind_unix(path, mode, group):
    """Listens at `path` with permissions `mode` from the first moment (the umask), replacing
    a socket a previous signer left there (a container restart), but never a live one or a
    file that is not a socket."""
    try:
        existing = os.lstat(path)
    except FileNotFoundError:
        existing = None
    if existing is not None:
        if not stat.S_ISSOCK(existing.st_mode):
            raise ConfigError(f"{path} exists and is not a socket: not replacing it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # nothing listens: a stale socket
        else:
            raise ConfigError(f"{path}: another process is listening there")
        finally:
            probe.close()
    previous = os.umask(0o777 & ~mode)
    try:
        server = UnixHTTPServer(path, Handler)
    finally:
        os.umask(previous)
    if group is not None:
        os.chown(path, -1, group)
    os.chmod(path, mode)
    return server


def make_server(config):
    if isinstance(config.listen, str):
        server = bind_unix(config.listen, config.socket_mode, config.socket_group)
        where = UNIX_PREFIX + config.listen
    else:
        server = ThreadingHTTPServer(config.listen, Handler)
        host, port = server.server_address[:2]
        where = f"{host}:{port}"
    return server, where


def serve(config):
    Handler.config = config
    server, where = make_server(config)
    socket_path = config.listen if isinstance(config.listen, str) else None
    socket_inode = os.lstat(socket_path).st_ino if socket_path else None
    print(
        f"signer: listening on {where} for runtime {config.runtime_id}",
        file=sys.stderr,
        flush=True,
    )
    # As a container's PID 1 it gets no default SIGTERM handler: stop on it explicitly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        # Its own socket only: a signer started since may have replaced it.
        if socket_path and os.path.exists(socket_path):
            if os.lstat(socket_path).st_ino == socket_inode:
                os.unlink(socket_path)


def healthcheck(env):
    """0 when the signer at SIGNER_LISTEN answers /healthz with 200, else 1."""
    try:
        listen = parse_listen(env.get("SIGNER_LISTEN") or DEFAULT_LISTEN)
        family = socket.AF_UNIX if isinstance(listen, str) else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as connection:
            connection.settimeout(3)
            connection.connect(listen)
            connection.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            status_line = connection.makefile("rb").readline().split()
        return 0 if status_line[1:2] == [b"200"] else 1
    except (ConfigError, OSError) as error:
        print(f"signer: {error}", file=sys.stderr)
        return 1


def main(argv):
    if argv[1:] == ["--healthcheck"]:
        return healthcheck(os.environ)
    try:
        config = Config(os.environ)
        serve(config)
    except (ConfigError, ValueError, OSError) as error:
        print(f"signer: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
