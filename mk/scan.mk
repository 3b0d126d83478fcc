# HLO exposure scanner.
#   make scan                      scan the tied-embedding model compiled on this machine's backend
#   make scan ARGS="dump_dir ..."  scan HLO files or --xla_dump_to directories
.PHONY: scan
scan: setup
	$(VENV)/bin/xla-harness scan $(if $(ARGS),$(ARGS),--model tied-embedding --all)
