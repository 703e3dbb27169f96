"""Flow-matching policies behind one protocol (ARCHITECTURE.md, "The policy protocol")."""
