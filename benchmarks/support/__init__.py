"""Measuring instruments of the benchmarks (and the tests): the ``--cases NAME@N`` syntax both harnesses share,
synthetic batches and step timing, the host-sync counter, CUDA's SDPA contracts emulated on CPU. Below every benchmark
module, so each of them may use them."""
