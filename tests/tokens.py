"""Test credentials in a provider's shape (the redaction rule and the literal-secret scan
key on the prefix), built at run time so that no literal in the tree looks like a leaked
token to a secret scanner."""

GITLAB = "glpat" + "-"


def gitlab_token(body: str) -> str:
    """A GitLab personal/project access token shape: `glpat-` and `body`."""
    return GITLAB + body


def pem_block(label: str, body: str) -> str:
    """A PEM-armoured block (`-----BEGIN <label>-----`) around `body`."""
    dashes = "-" * 5
    return f"{dashes}BEGIN {label}{dashes}\n{body}\n{dashes}END {label}{dashes}"
