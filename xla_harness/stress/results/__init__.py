"""Records and their store: the results schema (typed records), a record's line, the file mechanics
every JSONL file shares, the results file (writer, validating reader, resume checks, environment) and
the thread that writes it while the loop runs."""
