"""An OAuth 2.1 authorization server for Postern's tests, built on the official Python SDK's
server-side auth (`mcp.server.auth`): Dynamic Client Registration, PKCE (checked by the SDK's
token handler), RFC 8707 resources, RFC 7009 revocation, short-lived access tokens and rotating
refresh tokens. It approves every authorization request at once (the test plays the browser)
and redirects with `iss` (RFC 9207).

Everything it does is appended to $COUNTER_DIR/oauth.jsonl ({"grant": "authorization_code" |
"refresh_token" | "revoke", ...}) and every token it issues to $COUNTER_DIR/issued_tokens.txt,
so a test counts grants at the server and greps every file Postern wrote for each token.

Files that change what it does: $COUNTER_DIR/oauth_deny (authorization redirects with
error=access_denied), $COUNTER_DIR/oauth_revoke_all (every token is forgotten: a call then
needs a new sign-in). $OAUTH_TTL: access token lifetime in seconds (default 3600).

With $OAUTH_CIMD=1 it also takes Client ID Metadata Documents
(draft-ietf-oauth-client-id-metadata-document, as the MCP authorization spec uses them): its
metadata says `client_id_metadata_document_supported`, and a client ID that is an https URL is
fetched (recorded as {"grant": "cimd_fetch"}), must name itself as `client_id`, and its loopback
redirect URIs match any port (RFC 8252 section 7.3). The document is served over HTTPS on
127.0.0.1 with a self-signed certificate this process makes (see `serve_documents`).
"""

import datetime
import ipaddress
import json
import os
import secrets
import ssl
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    OAuthAuthorizationServerProvider,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken

DIR = Path(os.environ["COUNTER_DIR"])


def record(**fields) -> None:
    with open(DIR / "oauth.jsonl", "a") as f:
        f.write(json.dumps(fields) + "\n")


def issued(token: str) -> str:
    with open(DIR / "issued_tokens.txt", "a") as f:
        f.write(token + "\n")
    return token


CIMD = os.environ.get("OAUTH_CIMD") == "1"


def advertise_client_metadata_documents() -> None:
    """Makes the SDK's authorization-server metadata say `client_id_metadata_document_supported`
    (the SDK's server has no switch for it: its metadata builder is wrapped)."""
    from mcp.server.auth import routes

    plain = routes.build_metadata

    def with_cimd(*args, **kwargs):
        metadata = plain(*args, **kwargs)
        metadata.client_id_metadata_document_supported = True
        return metadata

    routes.build_metadata = with_cimd


def serve_documents() -> int:
    """Serves $COUNTER_DIR/documents/<path> over HTTPS on a free 127.0.0.1 port, with a
    self-signed certificate for 127.0.0.1 written to $COUNTER_DIR/cimd_cert.pem (the only
    certificate the document fetch trusts). Returns the port, also written to
    $COUNTER_DIR/cimd_port."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    (DIR / "cimd_cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (DIR / "cimd_key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )

    class Documents(BaseHTTPRequestHandler):
        def do_GET(self):
            path = (DIR / "documents" / self.path.lstrip("/")).resolve()
            if not path.is_relative_to((DIR / "documents").resolve()) or not path.is_file():
                self.send_response(404)
                self.end_headers()
                return
            body = path.read_bytes()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Documents)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(DIR / "cimd_cert.pem", DIR / "cimd_key.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    (DIR / "cimd_port").write_text(str(port))
    return port


class DocumentClient(OAuthClientInformationFull):
    """A client named by its metadata document: a loopback redirect URI it lists matches the
    same URI on any port (RFC 8252 section 7.3: a native client's port is ephemeral)."""

    def validate_redirect_uri(self, redirect_uri):
        if redirect_uri is not None:
            asked = urlparse(str(redirect_uri))
            for listed in self.redirect_uris or []:
                mine = urlparse(str(listed))
                if (
                    asked.scheme == mine.scheme == "http"
                    and asked.hostname == mine.hostname == "127.0.0.1"
                    and asked.path == mine.path
                ):
                    return redirect_uri
        return super().validate_redirect_uri(redirect_uri)


def fetch_document(client_id: str) -> OAuthClientInformationFull | None:
    """The client a metadata document at `client_id` describes (None: not one)."""
    parsed = urlparse(client_id)
    if parsed.scheme != "https" or parsed.path in ("", "/"):
        return None
    context = ssl.create_default_context(cafile=str(DIR / "cimd_cert.pem"))
    try:
        with urllib.request.urlopen(client_id, timeout=10, context=context) as answer:
            document = json.loads(answer.read())
    except Exception as e:  # noqa: BLE001 - any failure is "no such client"
        record(grant="cimd_fetch", ok=False, why=type(e).__name__)
        return None
    if document.get("client_id") != client_id:
        record(grant="cimd_fetch", ok=False, why="client_id_mismatch")
        return None
    record(grant="cimd_fetch", ok=True, client_id=client_id)
    # This server's policy: a client its document names may ask for any scope it has.
    document.setdefault("scope", "mcp extra")
    return DocumentClient.model_validate(document)


class CountingProvider(OAuthAuthorizationServerProvider[AuthorizationCode, RefreshToken, AccessToken]):
    def __init__(self, issuer: str):
        self.issuer = issuer
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.access: dict[str, AccessToken] = {}
        self.ttl = int(os.environ.get("OAUTH_TTL", "3600"))

    def revoked_all(self) -> bool:
        if (DIR / "oauth_revoke_all").exists():
            self.refresh.clear()
            self.access.clear()
            return True
        return False

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        if CIMD and client_id.startswith("https://"):
            return fetch_document(client_id)
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        record(grant="register", client_id=client_info.client_id)
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        redirect = str(params.redirect_uri)
        if (DIR / "oauth_deny").exists():
            return construct_redirect_uri(redirect, error="access_denied", state=params.state, iss=self.issuer)
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or ["mcp"],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        issued(code)
        record(grant="authorize", resource=params.resource, scopes=params.scopes)
        return construct_redirect_uri(redirect, code=code, state=params.state, iss=self.issuer)

    async def load_authorization_code(self, client, authorization_code: str) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    def tokens(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        access = issued("at_" + secrets.token_urlsafe(24))
        refresh = issued("rt_" + secrets.token_urlsafe(24))
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=int(time.time()) + self.ttl, resource=resource
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes, resource=resource)
        return OAuthToken(
            access_token=access, token_type="Bearer", expires_in=self.ttl, refresh_token=refresh, scope=" ".join(scopes)
        )

    async def exchange_authorization_code(self, client, authorization_code: AuthorizationCode) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        record(grant="authorization_code", client_id=client.client_id, resource=authorization_code.resource)
        return self.tokens(client.client_id, authorization_code.scopes, authorization_code.resource)

    async def load_refresh_token(self, client, refresh_token: str) -> RefreshToken | None:
        if self.revoked_all():
            return None
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(self, client, refresh_token: RefreshToken, scopes: list[str]) -> OAuthToken:
        # Rotation: the refresh token is good for one use.
        self.refresh.pop(refresh_token.token, None)
        record(grant="refresh_token", client_id=client.client_id)
        return self.tokens(client.client_id, scopes or refresh_token.scopes, refresh_token.resource)

    async def load_access_token(self, token: str) -> AccessToken | None:
        if self.revoked_all():
            return None
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token) -> None:
        record(grant="revoke", kind=type(token).__name__)
        self.refresh.pop(token.token, None)
        self.access.pop(token.token, None)
