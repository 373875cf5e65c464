"""The bearer-token check of the HTTP servers (the reward server, the environment server)."""
import hmac


def check_token(header, token):
    """None when `header` (an Authorization value) carries `token`, else the reason it does not."""
    if not header:
        return "missing 'Authorization: Bearer <token>' header; this server requires a token"
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given:
        return "the Authorization header must be 'Bearer <token>'"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "wrong bearer token"
    return None
