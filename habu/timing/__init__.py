"""Golden checks and timing of compiled plans on a GPU, in a worker process the search and the Ray pool
share (the benchmarks in `habu.bench` use it too)."""
