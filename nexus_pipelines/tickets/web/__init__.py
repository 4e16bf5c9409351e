"""The ticket pages: Board, Ticket Detail and Attention, server-rendered (seed 002 CX-15)."""
