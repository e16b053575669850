"""The project's own support above the benchmarks: the GPU check (runs tests/ and benchmarks/ on a lent GPU) and the
writer of ``auto``'s measured kernel table. Users run tools/; nothing here is imported below it."""
