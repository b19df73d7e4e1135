"""TODO: filled in by its issue."""
