"""Records and their store: the results schema (typed records), a record's line, the file mechanics
every JSONL file shares, the results file (writer, validating reader, resume checks), what every
record says of where it was made (provenance), and the thread that writes the file while the loop
runs."""
