"""Command line: the composition root (the only place sources, store and consumers are wired together)."""
