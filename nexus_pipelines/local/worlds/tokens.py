"""Test credentials in a provider's shape (the redaction rule and the literal-secret scan
key on the prefix), built at run time so that no literal in the tree looks like a leaked
token to a secret scanner."""

GITLAB = "glpat" + "-"


def gitlab_token(body: str) -> str:
    """A GitLab personal/project access token shape: `glpat-` and `body`."""
    return GITLAB + body


def github_token(prefix: str) -> str:
    """A GitHub token shape: `prefix` (`ghp_`, `ghs_`, `github_pat_`, ...) and 36 base62 characters."""
    return prefix + "A1bC2dE3fH4iJ5kL6mN7oP8qR9sT0uVwXyZa"


def atlassian_token() -> str:
    """An Atlassian API token shape: `ATATT3` and a long base64url body."""
    return "ATAT" + "T3xFfGF0a81bQ9zK2mW7pLq4Rt6Yv8Nc1Dd3Ee5Gg7Hh9Jj0Kk2" + "=3F1B2C"


def pem_block(label: str, body: str) -> str:
    """A PEM-armoured block (`-----BEGIN <label>-----`) around `body`."""
    dashes = "-" * 5
    return f"{dashes}BEGIN {label}{dashes}\n{body}\n{dashes}END {label}{dashes}"
