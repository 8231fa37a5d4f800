"""``engram bench``: the benchmarks. :mod:`engram_cli.bench.command` parses the command
line and runs one; each other module is one benchmark (load, overhead, pipeline, scale,
write path, corrections) or what they share (common, the scale corpus), and the LoCoMo
and paraphrase benchmarks are packages of their own."""
