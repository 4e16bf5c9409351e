"""Transport-only clients for the systems the project talks to."""
