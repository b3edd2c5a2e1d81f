"""Habu's version: part of every plan-database key and certificate."""

__version__ = "0.1.0"
