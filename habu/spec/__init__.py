"""The language: what a model computes (never how)."""
