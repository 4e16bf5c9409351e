"""Actors of the control plane: people or service identities with a credential issued once
(only its KDF hash is stored), project memberships with a role, and page sessions."""
