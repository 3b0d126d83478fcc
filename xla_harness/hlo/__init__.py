"""HLO text: parser, a model of XLA's fusion in-place alias tracing, scanner, buffer assignment."""
