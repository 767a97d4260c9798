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
"""

import json
import os
import secrets
import time
from pathlib import Path

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
