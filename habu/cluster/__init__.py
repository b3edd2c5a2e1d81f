"""Distributed tuning: the search's proofs, compiles and timings on a Ray cluster (cluster/ has
how to start one)."""
