"""The ticket pages: Board, Ticket Detail and Attention, server-rendered (docs/design/triage-authority.md)."""
