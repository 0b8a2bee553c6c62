#!/usr/bin/env python3
"""Keel identity signer: turns the user an authenticating proxy vouched for into a short-lived
HS256 JWT that a Keel runtime in remote mode accepts in `X-Keel-Identity`.

nginx calls it with `auth_request` for every request to a runtime. It reads the user from the
authenticating proxy's headers (oauth2-proxy: `X-Auth-Request-User`, `X-Auth-Request-Email`,
`X-Auth-Request-Preferred-Username`, `X-Auth-Request-Groups`), maps the user to an org (the Keel
workspace) and a role (`member` unless the mapping or one of the user's groups makes them an
`operator`), and answers
200 with the token in the `X-Keel-Identity` response header; 401 when no user is present, 403
when the user has no org. It trusts those headers, so it must be reachable only from nginx (a
private network or loopback), and nginx must set them itself (see deploy/proxy/nginx.conf).

Standard library only. Settings (environment):
  KEEL_RUNTIME_ID         required: the token's `aud`, the runtime's KEEL_RUNTIME_ID
  KEEL_REMOTE_JWT_SECRET  required, 32+ characters: the runtime's KEEL_REMOTE_JWT_SECRET
  SIGNER_LISTEN           IPv4 host:port, default 127.0.0.1:8088
  SIGNER_ORGS_FILE        JSON mapping of users to orgs (see README.md)
  SIGNER_DEFAULT_ORG      the org of users the mapping does not name (unset: they get 403)
  SIGNER_TTL_SECONDS      token lifetime, default 60, at most 300 (Keel's limit)
  SIGNER_KID              optional `kid` header, for a runtime that picks keys by id
  SIGNER_USER_HEADER      default X-Auth-Request-User
  SIGNER_EMAIL_HEADER     default X-Auth-Request-Email
  SIGNER_NAME_HEADER      default X-Auth-Request-Preferred-Username
  SIGNER_GROUPS_HEADER    default X-Auth-Request-Groups (a comma list, as oauth2-proxy sends it)
  SIGNER_OPERATOR_GROUPS  comma list of groups whose users are operators (unset: none)
"""

import base64
import hashlib
import hmac
import json
import os
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_TTL_SECONDS = 300
MIN_SECRET_LENGTH = 32
# Header values longer than this are not an identity; refuse rather than sign them.
MAX_VALUE_LENGTH = 256
# A groups header carries many names; longer than this, it is ignored (no group counts).
MAX_GROUPS_LENGTH = 8192
ROLES = ("member", "operator")


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
    object with `org` and optional `project`, `name` and `role` (`member` or `operator`)."""
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
        host, _, port = env.get("SIGNER_LISTEN", "127.0.0.1:8088").rpartition(":")
        self.listen = (host, int(port))
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
        """`operator` when the mapping entry says so or one of the user's groups is an
        operator group; else `member`, Keel's default, which the token states anyway."""
        if entry.get("role") == "operator" or self.operator_groups & set(groups):
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


def serve(config):
    Handler.config = config
    server = ThreadingHTTPServer(config.listen, Handler)
    host, port = server.server_address[:2]
    print(
        f"signer: listening on {host}:{port} for runtime {config.runtime_id}",
        file=sys.stderr,
        flush=True,
    )
    # As a container's PID 1 it gets no default SIGTERM handler: stop on it explicitly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


def main():
    try:
        config = Config(os.environ)
    except (ConfigError, ValueError, OSError) as error:
        print(f"signer: {error}", file=sys.stderr)
        return 2
    serve(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
