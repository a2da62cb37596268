"""chatstate."""
