"""HLO text: parser and its instruction checks, a model of XLA's fusion in-place alias tracing and
the layout math deciding what is a bitcast, scanner, buffer assignment."""
