"""HLO text: parser and its instruction checks, a model of XLA's fusion in-place alias tracing, scanner,
buffer assignment."""
