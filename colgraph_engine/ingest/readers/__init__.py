"""Readers: one file -> DocumentInput."""
