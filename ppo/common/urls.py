"""Server URLs as PaddleNLP's argument files give them (the reward server's, an environment
server's)."""


def normalize_url(url):
    """`url` with `http://` added when it has no scheme (`127.0.0.1:8731`, as PaddleNLP's
    files may give it); ValueError for an empty URL or a scheme other than http(s)."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError(f"reward server url must be a non-empty string, got {url!r}")
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"reward server url must use http:// or https://, got {url!r}")
    return url
